// Running a command line (the hyspec binary, as a user would) in tests.
#pragma once
#include <string>

namespace hyspec::test {

struct CommandResult {
  int exit_code = -1;  // -1: did not start or did not exit normally
  std::string output;  // stdout and stderr together
};

// Runs `command` through the shell with stderr joined to stdout.
CommandResult run_command(const std::string& command);

}  // namespace hyspec::test
