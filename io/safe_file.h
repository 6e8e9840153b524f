// Reading and replacing the files tide writes (the calibration file, the interposer's reports and
// traces) so that no path, however strange, makes tide hang or destroy something: a FIFO or
// device is never opened for writing nor read until it ends, a symlink is written through instead
// of replaced, and a file that is not tide's own is never overwritten. Errors are FileError with
// a message saying what is wrong with the path (callers prefix what the file is).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tide::io {

class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The contents of the regular file at `path` (symlinks followed). Throws FileError when it is
// absent, not a regular file, unreadable or larger than `max_bytes`.
std::string read_regular_file(const std::filesystem::path& path, std::size_t max_bytes);

// What replace_file does when the target's folder does not exist.
enum class Folder { kCreate, kMustExist };

// Writes `text` to `path` atomically: a new file in the same folder, written and flushed to the
// disk, then renamed over the target, so that a crash leaves the old file or the new one. The
// target is `path` with its symlinks followed (the links stay and see the new file). It must be
// absent (its folder is created, unless `folder` says otherwise) or a regular file that `ours`
// recognises from its first `max_bytes` bytes; anything else (a device, a FIFO, a folder, someone
// else's file) is refused.
void replace_file(const std::filesystem::path& path, std::string_view text, std::size_t max_bytes,
                  const std::function<bool(std::string_view)>& ours,
                  Folder folder = Folder::kCreate);

// Whether replace_file would write `path` (throws the FileError it would), without writing or
// creating anything: for callers that check an output path before a long computation.
void check_replaceable(const std::filesystem::path& path, std::size_t max_bytes,
                       const std::function<bool(std::string_view)>& ours);

}  // namespace tide::io
