# loom_optional_dependency(NAME OPTION_VAR HINT PACKAGE pkg [COMPONENTS ...]):
# AUTO finds it if it can, ON requires it (a configure error saying what to install), OFF skips.
# Sets LOOM_HAVE_<NAME> ON or OFF. A macro, not a function, so that what find_package defines
# (CUDAToolkit_LIBRARY_DIR, MPIEXEC_EXECUTABLE, ...) stays visible to the caller.
macro(loom_optional_dependency _ld_name _ld_option_var _ld_hint)
  cmake_parse_arguments(_ld "" "PACKAGE" "COMPONENTS" ${ARGN})
  string(TOUPPER "${${_ld_option_var}}" _ld_mode)
  if(NOT _ld_mode MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${_ld_option_var}=${_ld_mode}: expected AUTO, ON or OFF")
  endif()
  set(LOOM_HAVE_${_ld_name} OFF)
  if(NOT _ld_mode STREQUAL "OFF")
    if(_ld_COMPONENTS)
      find_package(${_ld_PACKAGE} QUIET COMPONENTS ${_ld_COMPONENTS})
    else()
      find_package(${_ld_PACKAGE} QUIET)
    endif()
    if(${_ld_PACKAGE}_FOUND)
      set(LOOM_HAVE_${_ld_name} ON)
    elseif(_ld_mode STREQUAL "ON")
      message(FATAL_ERROR "${_ld_option_var}=ON but ${_ld_name} was not found: install ${_ld_hint}")
    endif()
  endif()
endmacro()
