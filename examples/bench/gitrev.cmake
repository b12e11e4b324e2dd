# cmake -DSRC=<source dir> -DIN=<bench_git.h.in> -DOUT=<bench_git.h> -P gitrev.cmake
# Runs on every build (a custom target): rewrites OUT only when `git describe` changed, so an
# incremental build after a commit or an edit names the right tree and nothing else rebuilds.
execute_process(COMMAND git describe --always --dirty --tags
                WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE VCS_TAG OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR VCS_TAG STREQUAL "")
  set(VCS_TAG "unknown")
endif()
configure_file(${IN} ${OUT} @ONLY)
