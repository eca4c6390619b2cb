# LOOM_WITH_TORCH=AUTO|ON|OFF: the loom_torch extension (torch/), as optional as CUDA.
# Built against the torch of the Python that CMake finds (Python3_EXECUTABLE; in a virtual
# environment, its python): torch's own headers, libraries and pybind11, torch's C++ ABI for the
# whole build, and torch's version recorded in the package (loom_torch refuses another torch at
# import). torch 2.1 or newer. Needs loom's mpi or ucx backend (a build without Open MPI
# has ucx only: loom_torch.transports()). `pip install --no-build-isolation .`
# drives this file through scikit-build-core (pyproject.toml). Sets LOOM_HAVE_TORCH,
# LOOM_TORCH_VERSION, LOOM_TORCH_HAS_CUDA and, when OFF, LOOM_TORCH_WHY.
string(TOUPPER "${LOOM_WITH_TORCH}" _lt_mode)
if(NOT _lt_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "LOOM_WITH_TORCH=${_lt_mode}: expected AUTO, ON or OFF")
endif()
set(LOOM_HAVE_TORCH OFF)
set(LOOM_TORCH_WHY "")
set(LOOM_TORCH_HAS_CUDA OFF)
set(LOOM_TORCH_MINIMUM 2.1)
if(_lt_mode STREQUAL "OFF")
  set(LOOM_TORCH_WHY "LOOM_WITH_TORCH=OFF")
elseif(LOOM_SANITIZE)
  # A sanitizer runtime must be loaded first; python3 is not built with it.
  set(LOOM_TORCH_WHY "a sanitizer build (LOOM_SANITIZE=${LOOM_SANITIZE})")
elseif(NOT LOOM_HAVE_MPI AND NOT LOOM_HAVE_UCX)
  set(LOOM_TORCH_WHY "loom_torch needs a transport between processes: loom's mpi backend "
                     "(apt-get install libopenmpi-dev) or its ucx backend (apt-get install "
                     "libucx-dev); this build has neither")
else()
  find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
  if(NOT Python3_FOUND)
    set(LOOM_TORCH_WHY "no Python 3 with development headers (apt-get install python3-dev)")
  else()
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
              "import os, torch; print(torch.__version__); print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.version.cuda or '')"
      RESULT_VARIABLE _lt_rc OUTPUT_VARIABLE _lt_out ERROR_VARIABLE _lt_err
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _lt_rc EQUAL 0)
      string(REGEX REPLACE ".*\n([^\n]+)\n?$" "\\1" _lt_err "${_lt_err}")
      set(LOOM_TORCH_WHY "${Python3_EXECUTABLE} cannot import torch (${_lt_err}); "
                         "pip install torch in the environment whose python builds loom")
    else()
      string(REPLACE "\n" ";" _lt_out "${_lt_out}")
      list(GET _lt_out 0 LOOM_TORCH_VERSION)
      list(GET _lt_out 1 _lt_dir)
      list(GET _lt_out 2 _lt_abi)
      list(LENGTH _lt_out _lt_n)
      set(_lt_cuda "")
      if(_lt_n GREATER 3)
        list(GET _lt_out 3 _lt_cuda)
      endif()
      string(REGEX MATCH "^[0-9]+\\.[0-9]+" _lt_release "${LOOM_TORCH_VERSION}")
      set(_lt_libs)
      foreach(lib c10 torch torch_cpu torch_python)
        find_library(_lt_lib_${lib} ${lib} PATHS ${_lt_dir}/lib NO_DEFAULT_PATH)
        list(APPEND _lt_libs ${_lt_lib_${lib}})
      endforeach()
      if(_lt_release VERSION_LESS LOOM_TORCH_MINIMUM)
        set(LOOM_TORCH_WHY "torch ${LOOM_TORCH_VERSION} is older than ${LOOM_TORCH_MINIMUM}, the "
                           "oldest loom_torch supports (it is a c10d::Backend)")
      elseif(NOT EXISTS ${_lt_dir}/include/torch/csrc/distributed/c10d/Backend.hpp)
        set(LOOM_TORCH_WHY "torch in ${_lt_dir} has no C++ headers")
      elseif(NOT _lt_lib_torch_python)
        set(LOOM_TORCH_WHY "libtorch_python not found in ${_lt_dir}/lib")
      else()
        set(LOOM_HAVE_TORCH ON)
        if(_lt_cuda)
          set(LOOM_TORCH_HAS_CUDA ON)
        endif()
        # torch's C++ ABI for everything: libloom's std::string crosses into the extension
        # (g++'s default is the new ABI, which torch 2.6 and newer use too).
        if(NOT _lt_abi EQUAL 1)
          add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${_lt_abi})
        endif()
        # torch as an imported target: its headers (pybind11 included: another pybind11 fails
        # at import with "unknown base type c10d::Backend") and libraries, without
        # find_package(Torch), which on a CUDA build of torch wants the CUDA toolkit.
        add_library(loom_torch_libraries INTERFACE IMPORTED)
        target_include_directories(loom_torch_libraries SYSTEM INTERFACE
                                   ${_lt_dir}/include ${_lt_dir}/include/torch/csrc/api/include)
        target_link_libraries(loom_torch_libraries INTERFACE ${_lt_libs})
        target_compile_definitions(loom_torch_libraries INTERFACE TORCH_API_INCLUDE_EXTENSION_H)
        set(LOOM_TORCH_LIBRARY_DIR ${_lt_dir}/lib)
        message(STATUS "loom: torch ${LOOM_TORCH_VERSION} (${_lt_dir}, C++11 ABI ${_lt_abi}, "
                       "CUDA '${_lt_cuda}') for ${Python3_EXECUTABLE}")
      endif()
    endif()
  endif()
endif()
if(NOT LOOM_HAVE_TORCH)
  string(JOIN "" LOOM_TORCH_WHY ${LOOM_TORCH_WHY})
  if(_lt_mode STREQUAL "ON")
    message(FATAL_ERROR "LOOM_WITH_TORCH=ON but loom_torch cannot be built: ${LOOM_TORCH_WHY}")
  endif()
  message(STATUS "loom: no loom_torch: ${LOOM_TORCH_WHY}")
endif()
