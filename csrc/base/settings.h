// The R2CCL_* settings: each Config field's environment variable, kind and doc, in one table,
// and the one reader of the environment. Whatever host program loads the core (CPython through
// _core, NCCL through the net plugin) reads its settings here; jax_r2ccl/config.py builds its
// table from settings(). Knows nothing above base/.
#pragma once
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "base/config.h"

namespace r2ccl {

// What a setting's text is parsed as. kLevel: a name of kLogLevelNames (any case; WARNING
// too), stored as its index.
enum class SettingKind { kInt, kFloat, kBool, kString, kLevel };
// Exported to Python as _core.names()["setting_kinds"], in enum order.
inline constexpr const char* kSettingKindNames[] = {"int", "float", "bool", "str", "level"};

struct Setting {
  const char* env;      // R2CCL_CHUNK_BYTES
  const char* field;    // Python's field name; the Config member's, except R2CCL_DEBUG's ("debug")
  SettingKind kind;
  std::variant<int Config::*, uint64_t Config::*, double Config::*, bool Config::*, std::string Config::*> member;
  std::string doc;      // one paragraph, the README's settings table and `jax-r2ccl doctor` show it
};

// Every setting, in the README's order. Built once, on first use (any thread).
const std::vector<Setting>& settings();
// The setting whose variable is `env`; null if none.
const Setting* find_setting(const std::string& env);

// Parses `text` as the setting's kind into its Config member. Returns "" or a sentence that
// names the variable and the text. Ranges are Config::validate()'s.
std::string set_setting(Config& cfg, const Setting& s, const std::string& text);
// The member's value as text in the setting's own syntax (a level as its name, a bool as 0/1).
std::string setting_text(const Config& cfg, const Setting& s);

// Reads every setting whose variable `lookup` finds (the process environment when empty) into
// `cfg`, over the values it holds; `found` (optional) gets their variables. Returns "" or the
// first bad value's sentence. Does not validate() the result.
using EnvLookup = std::function<const char*(const char* name)>;
std::string read_settings(Config& cfg, const EnvLookup& lookup = {}, std::vector<std::string>* found = nullptr);

// A Config from the process environment, validated; an Error(kInvalidArgument) names the bad
// setting. (Names of plans and algorithms are coll/'s to check.)
Config config_from_environment();

}  // namespace r2ccl
