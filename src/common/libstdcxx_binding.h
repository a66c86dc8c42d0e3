// Whether this process's calls into libstdc++'s std::filesystem reach
// libstdc++. The torch wheel's libtorch.so exports its own copies of 64
// std::filesystem functions, and where a program's dynamic symbol lookup
// reaches torch's libraries before libstdc++ (its NEEDED list puts them
// first), its calls bind to those copies -- one of which jumps to address 0
// (issue 36 item 1, the GPU image's GCC 13 build). zero::zero's link option
// lists libstdc++ first; this names the hazard at startup where a program
// was linked otherwise, instead of a segfault later.
#pragma once

#include <string>

namespace zero {

// The library the calling program's std::filesystem::remove_all binds to
// when that is not libstdc++ (the dynamic linker's lookup from here, the
// order the program's own calls follow), else "".
std::string std_filesystem_served_elsewhere();

// std_filesystem_served_elsewhere() as a one-line warning for stderr, or "".
std::string std_filesystem_binding_warning();

}  // namespace zero
