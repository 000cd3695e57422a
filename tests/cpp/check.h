// The C++ tests' checks: check() records a failure and goes on (every failing check is
// named, the first 200 printed); checks_passed() ends main with the count or the line
// "NAME: all checks passed" that tests/test_cpp.py looks for.
#pragma once
#include <cstdio>
#include <string>

namespace r2ccl_test {

inline int g_failures = 0;

inline void check(bool ok, const std::string& what) {
  if (!ok) {
    if (g_failures < 200) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++g_failures;
  }
}

inline int checks_passed(const char* name) {
  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("%s: all checks passed\n", name);
  return 0;
}

}  // namespace r2ccl_test

using r2ccl_test::check;
using r2ccl_test::checks_passed;
using r2ccl_test::g_failures;
