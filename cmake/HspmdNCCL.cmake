# Finds NCCL next to the CUDA toolkit and provides the imported target hspmd::nccl_library, for
# hspmd's own build and its installed package config (the exported hspmd::nccl names the target,
# never a library path). Needs find_package(CUDAToolkit) first.
if(NOT TARGET hspmd::nccl_library AND CUDAToolkit_FOUND)
  find_path(HSPMD_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(HSPMD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(HSPMD_NCCL_INCLUDE_DIR AND HSPMD_NCCL_LIBRARY)
    add_library(hspmd::nccl_library UNKNOWN IMPORTED)
    set_target_properties(hspmd::nccl_library PROPERTIES
      IMPORTED_LOCATION "${HSPMD_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${HSPMD_NCCL_INCLUDE_DIR}")
  endif()
endif()
