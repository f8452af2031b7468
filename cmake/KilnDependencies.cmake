# KilnDependencies.cmake -- every third-party dependency of kiln as an imported target.
#
# A missing dependency stops the configure step with one message that names the package to
# install or the variable to set. `launch/setup.sh` installs all of them on Debian.
#
# Targets provided:
#   kiln::torch     LibTorch 2.x (torch_cpu + c10, and c10_cuda when it has CUDA; torch_cuda is
#                   loaded at run time, distributed/cuda_backend.h)
#   kiln::torch_cuda libtorch_cuda itself (CUDA LibTorch only), for a test that calls into it
#   kiln::openmp    the OpenMP runtime LibTorch uses (link only; KILN_OPENMP_FLAGS to compile)
#   MPI::MPI_CXX    Open MPI
#   cxxopts::cxxopts, nlohmann_json::nlohmann_json, GTest::gtest / GTest::gtest_main
#   CUDA::cudart    (when LibTorch has CUDA)
#   kiln::nccl      NCCL (when LibTorch has CUDA)
# Variables: KILN_HAVE_CUDA (LibTorch was built with CUDA; CUDA/NCCL code is compiled).

include_guard(GLOBAL)

# ---- LibTorch ------------------------------------------------------------------------------
# The pip wheel's CMake package lives in site-packages/torch/share/cmake. launch/setup.sh points
# CMAKE_PREFIX_PATH there; any other LibTorch 2.x works through Torch_DIR or CMAKE_PREFIX_PATH.
find_package(Torch QUIET CONFIG)
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "kiln: LibTorch not found. Set Torch_DIR (or CMAKE_PREFIX_PATH) to a LibTorch 2.x CMake "
    "package, e.g. -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)'), "
    "or run launch/setup.sh, which installs the pinned torch wheel into .venv.")
endif()
if(Torch_VERSION VERSION_LESS 2.4)
  message(FATAL_ERROR
    "kiln: LibTorch ${Torch_VERSION} at ${Torch_DIR} is too old (need 2.x with "
    "scaled_dot_product_attention and _fused_adamw_; Debian's libtorch-dev 1.13 is not usable). "
    "Point Torch_DIR at the pinned torch wheel (launch/setup.sh).")
endif()
add_library(kiln_torch INTERFACE)
if(TARGET torch_cuda AND TARGET torch_cpu_library AND TARGET c10_cuda)
  # Everything of LibTorch but libtorch_cuda.so (and libtorch.so, which only names it): that one
  # brings cuBLAS, cuDNN, cuFFT, cuSPARSE and nvJitLink, 0.15 s of every process's start-up, and
  # kiln loads it when a command may use a GPU (distributed/cuda_backend.h). Its compile
  # definitions stay, so every file compiles as before. kiln::torch_cuda: for a program (a GPU
  # test) that calls into it directly.
  target_link_libraries(kiln_torch INTERFACE torch_cpu_library c10_cuda)
  target_compile_definitions(kiln_torch INTERFACE $<TARGET_PROPERTY:torch_cuda,INTERFACE_COMPILE_DEFINITIONS>)
  add_library(kiln_torch_cuda INTERFACE)
  target_link_libraries(kiln_torch_cuda INTERFACE torch_cuda_library)
  add_library(kiln::torch_cuda ALIAS kiln_torch_cuda)
else()
  target_link_libraries(kiln_torch INTERFACE ${TORCH_LIBRARIES})
endif()
target_include_directories(kiln_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
# TORCH_CXX_FLAGS carries the C++ ABI define the library was built with.
separate_arguments(_kiln_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(kiln_torch INTERFACE ${_kiln_torch_flags})
# The wheel's libtorch exports std::filesystem symbols built against a newer libstdc++; if it is
# searched before the system libstdc++, std::filesystem::remove_all jumps through a null
# pointer. Putting libstdc++ first among the needed libraries makes the system's copy win.
target_link_options(kiln_torch INTERFACE "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
add_library(kiln::torch ALIAS kiln_torch)

set(KILN_HAVE_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES OR CAFFE2_USE_CUDA)
  set(KILN_HAVE_CUDA ON)
endif()
message(STATUS "kiln: LibTorch ${Torch_VERSION} (${Torch_DIR}), CUDA: ${KILN_HAVE_CUDA}")

# ---- OpenMP: LibTorch's thread pool in kiln's own loops -----------------------------------
# at::parallel_for is a header template. Under LibTorch's OpenMP backend (the pip wheel's) it
# splits its range only in a file compiled with OpenMP; elsewhere it runs on one thread. The few
# kiln files that call it are compiled with KILN_OPENMP_FLAGS, and kiln links kiln::openmp: the
# libgomp LibTorch itself loads (the wheel and the LibTorch zip ship one in lib/), so the process
# has one OpenMP runtime and at::set_num_threads sets kiln's thread count too. With LibTorch's
# native thread pool nothing is needed and both are empty.
set(KILN_OPENMP_FLAGS "")
add_library(kiln_openmp INTERFACE)
file(STRINGS "${TORCH_INSTALL_PREFIX}/include/ATen/Config.h" _kiln_at_openmp
  REGEX "^#define AT_PARALLEL_OPENMP 1")
if(_kiln_at_openmp)
  file(GLOB _kiln_torch_gomp "${TORCH_INSTALL_PREFIX}/lib/libgomp*.so*")
  if(_kiln_torch_gomp)
    list(GET _kiln_torch_gomp 0 _kiln_torch_gomp)
    set(KILN_OPENMP_FLAGS -fopenmp)
    target_link_libraries(kiln_openmp INTERFACE "${_kiln_torch_gomp}")
  else()
    find_package(OpenMP QUIET COMPONENTS CXX)
    if(NOT OpenMP_CXX_FOUND)
      message(FATAL_ERROR
        "kiln: LibTorch at ${TORCH_INSTALL_PREFIX} runs at::parallel_for on OpenMP, but neither it "
        "ships a libgomp nor was OpenMP found. Install the compiler's OpenMP runtime (Debian: "
        "libgomp1, with gcc) or set OpenMP_CXX_FLAGS and OpenMP_CXX_LIB_NAMES.")
    endif()
    separate_arguments(KILN_OPENMP_FLAGS UNIX_COMMAND "${OpenMP_CXX_FLAGS}")
    target_link_libraries(kiln_openmp INTERFACE ${OpenMP_CXX_LIBRARIES})
  endif()
endif()
add_library(kiln::openmp ALIAS kiln_openmp)

# ---- MPI -----------------------------------------------------------------------------------
find_package(MPI QUIET COMPONENTS CXX)
if(NOT MPI_CXX_FOUND)
  message(FATAL_ERROR
    "kiln: MPI not found. Install Open MPI (Debian: apt-get install libopenmpi-dev openmpi-bin) "
    "or set MPI_HOME / MPI_CXX_COMPILER.")
endif()

# ---- CLI and JSON --------------------------------------------------------------------------
find_package(cxxopts QUIET CONFIG)
if(NOT cxxopts_FOUND)
  message(FATAL_ERROR
    "kiln: cxxopts not found. Install it (Debian: apt-get install libcxxopts-dev) or set cxxopts_DIR.")
endif()
find_package(nlohmann_json 3 QUIET CONFIG)
if(NOT nlohmann_json_FOUND)
  message(FATAL_ERROR
    "kiln: nlohmann/json not found. Install it (Debian: apt-get install nlohmann-json3-dev) "
    "or set nlohmann_json_DIR.")
endif()

# ---- CUDA toolkit and NCCL (only with a CUDA LibTorch) -------------------------------------
if(KILN_HAVE_CUDA)
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    message(FATAL_ERROR
      "kiln: LibTorch has CUDA but the CUDA toolkit was not found. Put nvcc on PATH or set "
      "CUDAToolkit_ROOT (e.g. /usr/local/cuda).")
  endif()
  # NCCL: NCCL_ROOT wins, then the CUDA toolkit, then the nvidia-nccl wheel beside torch.
  get_filename_component(_kiln_site "${Torch_DIR}/../../../.." ABSOLUTE)
  find_path(KILN_NCCL_INCLUDE_DIR nccl.h
    HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} "${_kiln_site}/nvidia/nccl"
    PATH_SUFFIXES include)
  find_library(KILN_NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} "${_kiln_site}/nvidia/nccl"
    PATH_SUFFIXES lib lib64)
  if(NOT KILN_NCCL_INCLUDE_DIR OR NOT KILN_NCCL_LIBRARY)
    message(FATAL_ERROR
      "kiln: NCCL not found (nccl.h: ${KILN_NCCL_INCLUDE_DIR}, libnccl: ${KILN_NCCL_LIBRARY}). "
      "Set NCCL_ROOT to an NCCL install, or install the CUDA toolkit's NCCL.")
  endif()
  add_library(kiln::nccl UNKNOWN IMPORTED)
  set_target_properties(kiln::nccl PROPERTIES
    IMPORTED_LOCATION "${KILN_NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${KILN_NCCL_INCLUDE_DIR}")
  message(STATUS "kiln: NCCL ${KILN_NCCL_LIBRARY}")
endif()

# ---- GoogleTest (tests only) ---------------------------------------------------------------
if(KILN_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    message(FATAL_ERROR
      "kiln: GoogleTest not found. Install it (Debian: apt-get install libgtest-dev) or set "
      "GTest_ROOT, or configure with -DKILN_BUILD_TESTS=OFF.")
  endif()
endif()
