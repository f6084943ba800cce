# tiers.cmake - tally_test(): one ctest test per tier of a test program, with its label, its time limit
# (about 3x what it takes) and its cost (ctest -j starts the costly ones first until it has its own times).
#
#   tally_test(NAME [QUICK s] [LONG s] [EXTERNAL s] [THREADS] [SERIAL label...] [ENV VAR=value...]
#              [COMMAND cmd...])
#
# s: the whole seconds (rounded up) the tier takes in a Release build on the slower 2-core machine kind,
# the larger of its time alone and under ./test.sh (ctest -j2, beside another test). A program with cases
# in several tiers runs once per tier, TALLY_TEST_TIER telling it which (tests/harness/harness.h); the
# first tier keeps NAME, the others are NAME_long and NAME_external.
# SERIAL names, by label (quick, long, external: in lower case, or cmake_parse_arguments would read QUICK as
# the next keyword), the tiers that measure time or need both cores: ctest runs them alone (RUN_SERIAL).
# THREADS: the test is one of ThreadSanitizer's; a TALLY_TSAN build registers (and builds) those alone.
# COMMAND defaults to the executable NAME.

# About the most the sanitizers slow a test (measured: ASan up to 6.6x for test_flags, TSan up to 32x for
# test_zero's short runs, about 3x typically): the time limits grow by as much.
set(TALLY_TEST_SLOWDOWN "" CACHE STRING
  "Factor on every test's time limit (empty: 1, 8 under ASan, 12 under TSan); raise it under valgrind")

function(tally_test_slowdown out)
  if(TALLY_TEST_SLOWDOWN)
    set(${out} ${TALLY_TEST_SLOWDOWN} PARENT_SCOPE)
  elseif(TALLY_TSAN)
    set(${out} 12 PARENT_SCOPE)
  elseif(TALLY_SANITIZE)
    set(${out} 8 PARENT_SCOPE)
  else()
    set(${out} 1 PARENT_SCOPE)
  endif()
endfunction()

function(tally_test name)
  cmake_parse_arguments(T "THREADS" "QUICK;LONG;EXTERNAL" "SERIAL;ENV;COMMAND" ${ARGN})
  if(T_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "tally_test(${name}): unknown arguments ${T_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT T_COMMAND)
    set(T_COMMAND ${name})
  endif()
  set(tiers "")
  foreach(tier QUICK LONG EXTERNAL)
    if(DEFINED T_${tier})
      list(APPEND tiers ${tier})
    endif()
  endforeach()
  if(NOT tiers)
    message(FATAL_ERROR "tally_test(${name}): give it a tier (QUICK, LONG or EXTERNAL) and its seconds")
  endif()
  set_property(GLOBAL APPEND PROPERTY TALLY_TESTS_LISTED ${name})
  tally_test_slowdown(slowdown)
  if(TALLY_TSAN AND NOT T_THREADS)
    if(TARGET ${name})
      set_target_properties(${name} PROPERTIES EXCLUDE_FROM_ALL ON)
    endif()
    return()
  endif()
  list(GET tiers 0 first)
  foreach(tier ${tiers})
    string(TOLOWER ${tier} label)
    if(tier STREQUAL first)
      set(test ${name})
    else()
      set(test ${name}_${label})
    endif()
    set(secs ${T_${tier}})
    math(EXPR timeout "${secs} * 3 * ${slowdown}")
    if(timeout LESS 15) # seconds: a process started on a loaded machine can take a few
      set(timeout 15)
    endif()
    add_test(NAME ${test} COMMAND ${T_COMMAND})
    set(env TALLY_TEST_TIER=${label} TALLY_BIN=$<TARGET_FILE:tally> TALLY_SOURCE_DIR=${CMAKE_SOURCE_DIR} ${T_ENV})
    set_tests_properties(${test} PROPERTIES LABELS ${label} TIMEOUT ${timeout} COST ${secs} SKIP_RETURN_CODE 77
      ENVIRONMENT "${env}")
    if(label IN_LIST T_SERIAL)
      set_tests_properties(${test} PROPERTIES RUN_SERIAL ON)
    endif()
  endforeach()
endfunction()
