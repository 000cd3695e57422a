// CHECK for the fuzz harnesses: a property that failed aborts, so libFuzzer saves the input.
#pragma once
#include <cstdio>
#include <cstdlib>

#define CHECK(c)                                          \
  do {                                                    \
    if (!(c)) {                                           \
      std::fprintf(stderr, "check failed: %s\n", #c);     \
      std::abort();                                       \
    }                                                     \
  } while (0)
