# Flags for hspmd's own tests, examples and benchmarks (never pushed onto consumers):
# hspmd_dev_flags is an internal INTERFACE target those link to.
#   HSPMD_WARNINGS_AS_ERRORS  -Werror on top of the warning set below
#   HSPMD_SANITIZE            AddressSanitizer + UndefinedBehaviorSanitizer, no recovery
#   HSPMD_SANITIZE_ALL_UB     UBSan's null and alignment checks too (off: see below)
#   HSPMD_NATIVE_ARCH         -march=native (the release preset: benchmarks and the demo)
# hspmd_warning_flags: the warnings (and -Werror) alone, for code that is only compiled, never
# run (the header self-containment check): sanitizers would only slow its compile.
add_library(hspmd_dev_flags INTERFACE)
add_library(hspmd_warning_flags INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(hspmd_warning_flags INTERFACE
    -Wall -Wextra -Wpedantic -Wconversion -Wsign-conversion -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wnull-dereference -Wdouble-promotion
    -Wformat=2 -Wimplicit-fallthrough -Wunused
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>
    $<$<BOOL:${HSPMD_WARNINGS_AS_ERRORS}>:-Werror>)
  target_compile_options(hspmd_dev_flags INTERFACE
    -Wall -Wextra -Wpedantic -Wconversion -Wsign-conversion -Wshadow -Wnon-virtual-dtor
    -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wnull-dereference -Wdouble-promotion
    -Wformat=2 -Wimplicit-fallthrough -Wunused)
  # GCC 12 at -O3 warns about std::string concatenation in libstdc++ itself (GCC bug 105329).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(hspmd_dev_flags INTERFACE -Wno-restrict)
  endif()
  if(HSPMD_WARNINGS_AS_ERRORS)
    target_compile_options(hspmd_dev_flags INTERFACE -Werror)
  endif()
  if(HSPMD_NATIVE_ARCH)
    target_compile_options(hspmd_dev_flags INTERFACE -march=native ${HSPMD_WIDE_VECTORS})
  endif()
  if(HSPMD_SANITIZE)
    set(hspmd_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=all
                             -fno-omit-frame-pointer)
    # UBSan's null and alignment checks cost a quarter of the dev build's compile time (26 s ->
    # 19 s for one test file) and add little here: AddressSanitizer reports every null access
    # with its stack, and x86 does not fault on misalignment. HSPMD_SANITIZE_ALL_UB turns them on.
    if(NOT HSPMD_SANITIZE_ALL_UB)
      list(APPEND hspmd_sanitize_flags -fno-sanitize=null,alignment)
    endif()
    target_compile_options(hspmd_dev_flags INTERFACE ${hspmd_sanitize_flags})
    target_link_options(hspmd_dev_flags INTERFACE ${hspmd_sanitize_flags})
  endif()
elseif(MSVC)
  target_compile_options(hspmd_dev_flags INTERFACE /W4 $<$<BOOL:${HSPMD_WARNINGS_AS_ERRORS}>:/WX>)
endif()
