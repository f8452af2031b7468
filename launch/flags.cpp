// launch/flags.cpp -- see flags.h.
#include "launch/flags.h"

#include "distributed/error.h"
#include "distributed/suggest.h"

namespace kiln {

cxxopts::ParseResult parse_or_throw(cxxopts::Options& opts, const std::vector<std::string>& args, const std::string& command,
                                    const std::string& positional_hint, const std::map<std::string, std::string>& aliases) {
  std::vector<const char*> argv{command.c_str()};
  for (const auto& a : args) argv.push_back(a.c_str());
  opts.allow_unrecognised_options();
  try {
    auto result = opts.parse(static_cast<int>(argv.size()), argv.data());
    std::vector<std::string> names;
    for (const auto& o : opts.group_help("").options)
      for (const auto& n : o.l) names.push_back("--" + n);
    std::vector<std::pair<std::string, std::string>> unknown;
    std::vector<std::string> stray;  // after an unknown flag, most likely its value: the flag is named then
    for (const auto& u : result.unmatched()) {
      if (u.rfind("-", 0) == 0) unknown.emplace_back(u, did_you_mean(u.substr(0, u.find('=')), names, aliases));
      else stray.push_back(u);
    }
    if (!unknown.empty()) throw ConfigError(unknown_names("unknown flag", "unknown flags", unknown) + " (see kiln " + command + " --help)");
    if (!stray.empty()) {
      throw ConfigError("kiln " + command + ": unexpected argument '" + stray[0] + "'" +
                        (positional_hint.empty() ? "" : " (" + positional_hint + ")"));
    }
    return result;
  } catch (const cxxopts::exceptions::exception& e) {
    throw ConfigError("kiln " + command + ": " + e.what());
  }
}

}  // namespace kiln
