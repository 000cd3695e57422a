// The two lookups every enum with a name table needs (kind, reduce op, dtype, plan, cause):
// enum -> its name, name -> enum. The tables live next to their enums; this file knows none
// of them.
#pragma once
#include <cstddef>
#include <string>

namespace r2ccl {

// The name of `e` in `table` (indexed by the enum's value), or `fallback` when out of range.
template <class E, size_t N>
const char* enum_name(const char* const (&table)[N], E e, const char* fallback) {
  const auto i = static_cast<size_t>(e);
  return i < N ? table[i] : fallback;
}

// Sets *out (when not null) to the enum whose name is `name`; false when none is.
template <class E, size_t N>
bool parse_enum(const char* const (&table)[N], const std::string& name, E* out) {
  for (size_t i = 0; i < N; i++)
    if (name == table[i]) {
      if (out) *out = static_cast<E>(i);
      return true;
    }
  return false;
}

}  // namespace r2ccl
