# Finds OpenBLAS's CBLAS (the library through FindBLAS, and cblas.h) and provides the imported
# target hspmd::cblas. hspmd's own build and its installed package config both use this file, so
# a consumer resolves BLAS on its own machine: the exported hspmd::exec names hspmd::cblas, never
# a library path.
if(NOT TARGET hspmd::cblas)
  set(_hspmd_saved_vendor "${BLA_VENDOR}")
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
  set(BLA_VENDOR "${_hspmd_saved_vendor}")
  unset(_hspmd_saved_vendor)
  find_path(HSPMD_CBLAS_INCLUDE_DIR cblas.h
    PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread openblas-pthread openblas)
  if(TARGET BLAS::BLAS AND HSPMD_CBLAS_INCLUDE_DIR)
    add_library(hspmd::cblas INTERFACE IMPORTED)
    set_target_properties(hspmd::cblas PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${HSPMD_CBLAS_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES BLAS::BLAS)
  endif()
endif()
