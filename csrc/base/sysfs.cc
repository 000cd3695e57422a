#include "base/sysfs.h"

#include <dirent.h>

#include <fstream>

namespace r2ccl {

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!f || !std::getline(f, s)) return "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  closedir(d);
  return out;
}

}  // namespace r2ccl
