# KilnCompilerCache -- compile through ccache, with the settings that let it cache kiln's calls.
#
# Without them ccache caches almost nothing here: every kiln_core file and test includes the
# precompiled LibTorch header (CMake passes `-include .../cmake_pch.hxx`), and ccache refuses a
# compile that uses a precompiled header ("uncacheable") unless told its sloppiness allows it:
#   pch_defines, time_macros          what ccache's manual asks for with precompiled headers (it
#                                     cannot see #defines or __TIME__ through a .gch);
#   include_file_mtime, include_file_ctime
#                                     headers of a fresh clone or a fresh venv are newer than
#                                     ccache's guard window; their contents are still hashed.
# and base_dir = the source tree, so the absolute paths CMake writes (sources, -I of the build
# tree and .venv/) are hashed relative to the build directory: a second clone of kiln on the same
# machine hits the first clone's objects. The settings go on the launcher's command line (through
# `cmake -E env`), so they hold for any `cmake --build` or `ninja` call, whatever the user's
# ccache.conf says, and change nothing for other projects.
#
# KILN_CCACHE=OFF, or a CMAKE_<LANG>_COMPILER_LAUNCHER given on the command line, turns this off.
option(KILN_CCACHE "Compile through ccache when it is installed" ON)
find_program(KILN_CCACHE_PROGRAM ccache)
if(KILN_CCACHE AND KILN_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(_kiln_ccache_env
    "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
    "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}")
  set(CMAKE_C_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env ${_kiln_ccache_env} ${KILN_CCACHE_PROGRAM})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env ${_kiln_ccache_env} ${KILN_CCACHE_PROGRAM})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env ${_kiln_ccache_env} ${KILN_CCACHE_PROGRAM})
  message(STATUS "kiln: compiling through ${KILN_CCACHE_PROGRAM} (sloppiness for the precompiled header, base_dir ${CMAKE_SOURCE_DIR})")
endif()
