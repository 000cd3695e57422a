// Reading sysfs (and other small text files): shared by the NIC monitor and the RDMA port
// map. Knows nothing above base/.
#pragma once
#include <string>
#include <vector>

namespace r2ccl {

// The file's first line without trailing spaces, newlines or NULs; "" when it cannot be read.
std::string read_first_line(const std::string& path);
// The names in a directory, without "." entries; empty when it cannot be read. Unsorted.
std::vector<std::string> list_dir(const std::string& path);

}  // namespace r2ccl
