// distributed/python_tool.h -- kiln's Python parts (tools/*.py) run from the C++ side.
//
// Two things kiln leaves to well-kept Python libraries: plotting (`kiln report`, matplotlib) and
// BPE encoding (`kiln prep --tokenizer`, `kiln sample` with a BPE checkpoint; Hugging Face's
// tokenizers). Both run a script of tools/ with the project's Python: the environment's
// KILN_PYTHON, else the one the build was configured with (the .venv of launch/setup.sh).
// A tool reports bad input itself: one line `kiln: error: ...` on stderr, exit 2.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kiln {

struct ToolRun {
  int exit_code = 0;  // the script's exit status; 128 + N when signal N ended it
  std::string out;    // everything it wrote to stdout (binary safe)
  std::string err;    // everything it wrote to stderr
};

// Runs `python tools/<script> args...` and returns what it printed. `needs` says what the
// script needs, for the message when the interpreter or the script is missing ("kiln report needs
// Python with matplotlib"): ConfigError then. on_stderr_line, when given, sees each whole line of
// stderr as it arrives (a long run's progress; the lines are in ToolRun::err too).
ToolRun run_python_tool(const std::string& script, const std::vector<std::string>& args, const std::string& needs,
                        const std::function<void(const std::string&)>& on_stderr_line = nullptr);

// The same, in place of this process (execv): its output is the user's; never returns.
[[noreturn]] void exec_python_tool(const std::string& script, const std::vector<std::string>& args, const std::string& needs);

// A failed run as one line: the script's own `kiln: error: ` line without that prefix, else its
// last line of stderr, else its exit status.
std::string tool_failure(const ToolRun& run, const std::string& script);

}  // namespace kiln
