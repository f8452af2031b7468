// runtime/trainer/save_dir_lock.h -- one job per save directory, and a save directory that can be
// written, checked at start-up.
//
// Two jobs saving into one --save-dir overwrite each other's checkpoints. The job's rank 0 holds
// an exclusive lock on DIR/.kiln.lock (flock, non-blocking) for its whole life; a second job is
// refused at start-up with one line naming the holder (host, pid, since when, its command). The
// kernel drops the lock when the holding process ends, however it ends, so a lock is never left
// held by a dead process: the file itself stays with the dead holder's details, and the next job
// takes the lock over and says whose it was. (flock works across NFS clients on Linux, through
// the NFS lock manager; a file system without locks makes the lock fail with its reason.)
// Writability is checked in the same place: a probe file is created and removed, so a read-only
// or unwritable directory ends the job at start-up (exit 2), not at its first save hours later.
// A job that changed nothing in the directory -- refused at set-up (a bad flag, a layout that does
// not fit, a refused resume), failed before its first save, or had nothing to train -- leaves it
// as it found it: the lock file removed if this job created it (a failed job puts back the text
// it found there), the directory removed if this job created it (and its parents it created,
// each only while empty). Nothing
// the directory held before is ever deleted. (A job that opened the lock file just before it was
// removed finds, once it holds the lock, that the path no longer names its file, and opens it
// again: two jobs never hold locks on two files of one name.)
#pragma once

#include <set>
#include <string>

namespace kiln {

class SaveDirLock {
 public:
  // Creates `dir` if needed, checks it can be written, takes the lock and records this process as
  // the holder. Throws ConfigError naming the directory and the reason (another live holder, not
  // writable, cannot lock).
  explicit SaveDirLock(std::string dir);
  ~SaveDirLock();  // empties the holder record and releases the lock (or leaves the directory as found)
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

  // "" or, when the lock file named a holder that is gone (a job that did not end cleanly), one
  // line saying whose lock was taken over.
  const std::string& notice() const { return notice_; }

 private:
  void acquire();         // the constructor's work
  // Takes away what this job added: its lock file (or, `failed`, puts back the record it found),
  // the directories it created.
  void leave_as_found(bool failed);

  std::string dir_;
  int fd_ = -1;
  std::string notice_;
  std::string created_;            // the topmost directory this job created for dir_ ("" when dir_ was there)
  bool created_file_ = false;      // the lock file is this job's (absent before)
  bool wrote_ = false;             // this job's details replaced previous_ in the lock file
  std::string previous_;           // the lock file's text before: a crashed holder's details, or ""
  std::set<std::string> entries_;  // dir_'s entries when the lock was taken (the lock file aside)
};

}  // namespace kiln
