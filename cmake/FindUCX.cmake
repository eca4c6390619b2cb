# FindUCX: finds UCX's ucp/api/ucp.h with libucp and libucs (pkg-config `ucx` first, then /usr or
# UCX_ROOT) and defines UCX::ucp.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_UCX QUIET ucx)
endif()
find_path(UCX_INCLUDE_DIR ucp/api/ucp.h
          HINTS ${UCX_ROOT} $ENV{UCX_ROOT} ${PC_UCX_INCLUDE_DIRS}
          PATH_SUFFIXES include)
find_library(UCX_UCP_LIBRARY ucp HINTS ${UCX_ROOT} $ENV{UCX_ROOT} ${PC_UCX_LIBRARY_DIRS}
             PATH_SUFFIXES lib lib64)
find_library(UCX_UCS_LIBRARY ucs HINTS ${UCX_ROOT} $ENV{UCX_ROOT} ${PC_UCX_LIBRARY_DIRS}
             PATH_SUFFIXES lib lib64)
if(UCX_INCLUDE_DIR AND EXISTS "${UCX_INCLUDE_DIR}/ucp/api/ucp_version.h")
  file(STRINGS "${UCX_INCLUDE_DIR}/ucp/api/ucp_version.h" _ucx_version_lines
       REGEX "#define UCP_API_(MAJOR|MINOR) ")
  foreach(part MAJOR MINOR)
    string(REGEX MATCH "UCP_API_${part} +([0-9]+)" _m "${_ucx_version_lines}")
    set(UCX_VERSION_${part} ${CMAKE_MATCH_1})
  endforeach()
  set(UCX_VERSION "${UCX_VERSION_MAJOR}.${UCX_VERSION_MINOR}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(UCX REQUIRED_VARS UCX_UCP_LIBRARY UCX_UCS_LIBRARY UCX_INCLUDE_DIR
                                  VERSION_VAR UCX_VERSION)
if(UCX_FOUND AND NOT TARGET UCX::ucp)
  add_library(UCX::ucs UNKNOWN IMPORTED)
  set_target_properties(UCX::ucs PROPERTIES IMPORTED_LOCATION "${UCX_UCS_LIBRARY}"
                                            INTERFACE_INCLUDE_DIRECTORIES "${UCX_INCLUDE_DIR}")
  add_library(UCX::ucp UNKNOWN IMPORTED)
  set_target_properties(UCX::ucp PROPERTIES IMPORTED_LOCATION "${UCX_UCP_LIBRARY}"
                                            INTERFACE_INCLUDE_DIRECTORIES "${UCX_INCLUDE_DIR}"
                                            INTERFACE_LINK_LIBRARIES UCX::ucs)
endif()
mark_as_advanced(UCX_INCLUDE_DIR UCX_UCP_LIBRARY UCX_UCS_LIBRARY)
