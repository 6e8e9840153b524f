#include "io/safe_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <system_error>
#include <utility>

namespace tide::io {
namespace {

namespace fs = std::filesystem;

std::string error_text(int error) { return std::generic_category().message(error); }

// Closes a descriptor when it goes.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// `path` with every symlink on its last component followed (a dangling one too: its target is
// what is written). Bounded, as the kernel bounds symlink chains.
fs::path follow_links(fs::path path) {
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    const fs::file_status status = fs::symlink_status(path, ec);
    if (ec || status.type() != fs::file_type::symlink) return path;
    const fs::path target = fs::read_symlink(path, ec);
    if (ec) throw FileError("cannot read the symlink " + path.string() + ": " + ec.message());
    path = target.is_absolute() ? target : path.parent_path() / target;
  }
  throw FileError("too many levels of symlinks");
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The regular file at `path` (symlinks followed): its first `max_bytes` bytes, or all of it
// (`whole`: a larger file is an error).
std::string read_regular(const fs::path& path, std::size_t max_bytes, bool whole) {
  // O_NONBLOCK: opening a FIFO without a writer must not wait for one.
  Descriptor fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) throw FileError("cannot be read: " + error_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw FileError("cannot be read: " + error_text(errno));
  if (!S_ISREG(st.st_mode)) {
    throw FileError(std::string("is ") + kind_of(st.st_mode) + ", not a regular file");
  }
  const auto too_large = [&] {
    return FileError("larger than " + std::to_string(max_bytes) + " bytes");
  };
  if (whole && static_cast<std::uint64_t>(st.st_size) > max_bytes) throw too_large();
  std::string text;
  char buffer[4096];
  while (text.size() < max_bytes || whole) {
    const std::size_t want =
        whole ? sizeof buffer : std::min(sizeof buffer, max_bytes - text.size());
    const ssize_t n = ::read(fd.get(), buffer, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw FileError("cannot be read: " + error_text(errno));
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (whole && text.size() > max_bytes) throw too_large();
  }
  return text;
}

}  // namespace

std::string read_regular_file(const fs::path& path, std::size_t max_bytes) {
  return read_regular(path, max_bytes, /*whole=*/true);
}

namespace {

// The target replace_file writes, checked: absent, or a regular file that is `ours`.
fs::path checked_target(const fs::path& path, std::size_t max_bytes,
                        const std::function<bool(std::string_view)>& ours) {
  fs::path target = follow_links(path);
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      throw FileError(std::string("is ") + kind_of(st.st_mode) +
                      ": tide writes only regular files of its own");
    }
    std::string existing;
    try {
      existing = read_regular(target, max_bytes, /*whole=*/false);
    } catch (const FileError& e) {
      throw FileError("exists and " + std::string(e.what()) + ": not replaced");
    }
    if (!ours(existing)) {
      throw FileError(
          "exists and is not a file tide wrote: not replaced (remove it, or choose "
          "another path)");
    }
  } else if (errno != ENOENT) {
    throw FileError("cannot be examined: " + error_text(errno));
  }
  return target;
}

}  // namespace

void check_replaceable(const fs::path& path, std::size_t max_bytes,
                       const std::function<bool(std::string_view)>& ours) {
  checked_target(path, max_bytes, ours);
}

void replace_file(const fs::path& path, std::string_view text, std::size_t max_bytes,
                  const std::function<bool(std::string_view)>& ours, Folder folder) {
  const fs::path target = checked_target(path, max_bytes, ours);
  if (folder == Folder::kCreate && !fs::exists(target) && target.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec) throw FileError("cannot create its folder: " + ec.message());
  }

  // A new file next to the target, its name unpredictable and made exclusively: never an
  // existing file, never through a symlink someone put there.
  std::random_device random;
  fs::path temporary = target;
  temporary += ".tmp" + std::to_string(::getpid()) + "." + std::to_string(random());
  Descriptor fd(
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    throw FileError("cannot create " + temporary.string() + ": " + error_text(errno));
  }
  auto fail = [&](const std::string& what) {
    const int error = errno;
    ::close(fd.release());
    ::unlink(temporary.c_str());
    throw FileError(what + ": " + error_text(error));
  };
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot write " + temporary.string());
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0) fail("cannot write " + temporary.string());
  if (::close(fd.release()) != 0) fail("cannot write " + temporary.string());
  if (::rename(temporary.c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw FileError("cannot be replaced: " + error_text(error));
  }
}

}  // namespace tide::io
