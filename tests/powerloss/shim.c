/*
 * Power-loss recorder: an LD_PRELOAD shim that logs every write and sync the process makes
 * to the spool's files, with the bytes written, so a replayer can rebuild what a disk could
 * hold after a power cut at any point of the run.
 *
 * Environment:
 *   POWERLOSS_LOG   the log file (opened O_APPEND; the load client appends its ACK records to
 *                   the same file, so the log's order is the order in which syncs finished
 *                   and acknowledgements arrived)
 *   POWERLOSS_DIR   the directory holding the spool (absolute); files in it whose name starts
 *                   with POWERLOSS_PREFIX (default "spool.db") are recorded, except the -shm
 *                   file (shared memory that SQLite rebuilds from the WAL after a crash), and
 *                   the directory itself is recorded for its fsyncs (which make creations,
 *                   unlinks and renames durable)
 *   POWERLOSS_KILL_FIFO  a FIFO; when a byte arrives on it, the process SIGKILLs itself while
 *                   holding the recorder's mutex, so no recorded operation is between
 *                   happening and being logged when it dies (a SIGKILL from outside can land
 *                   between a pwrite and its log record, and the disk then holds a write the
 *                   log lacks). Only the process LISTEN_PID names listens on it: the
 *                   intake after the wrapper shell's exec, not the shell, not a child.
 *   POWERLOSS_SKIP_SYNC=1  a planted fault for the harness's self-test: fsync and fdatasync on
 *                   recorded files return success without syncing and without being logged,
 *                   as a build that acknowledged before its data reached the disk would
 *
 * Each record is one write() on the O_APPEND log: a fixed header, then `len` bytes.
 * The header layout is mirrored by tests/powerloss/replay.rs; keep them together.
 *
 * A mutex orders the recorded operation and its log record, so the log's order is the
 * order the operations happened in. Writes are logged after they succeed, with the number of
 * bytes the kernel took; syncs are logged after they return 0, so an ACK that follows a SYNC
 * in the log was sent after that sync finished.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

enum {
    OP_OPEN = 1,   /* fd, aux = 1 if the call created the file, 2 if it truncated it; path */
    OP_WRITE = 2,  /* fd, off, the bytes */
    OP_TRUNC = 3,  /* fd, off = new length */
    OP_SYNC = 4,   /* fd */
    OP_CLOSE = 5,  /* fd */
    OP_UNLINK = 6, /* path */
    OP_RENAME = 7, /* "old\0new" */
    OP_ACK = 8,    /* written by the load client: the acknowledged id */
};

struct rec {
    uint32_t magic; /* 0x504c5752 "RWLP" */
    uint32_t op;
    int32_t fd;
    uint32_t aux;
    uint64_t off;
    uint64_t len;
};

#define MAGIC 0x504c5752u
#define MAX_FD 65536

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static int skip_sync = 0;
static char dir[4096];
static size_t dir_len;
static char prefix[256] = "spool.db";
/* 0: not recorded, 1: a recorded file, 2: the recorded directory */
static unsigned char tracked[MAX_FD];

static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_close)(int);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static off_t (*real_lseek)(int, off_t, int);

/* Waits for a byte on the kill FIFO, then dies holding the mutex: every recorded operation
 * before the kill is logged, and none can start after it. */
static void *killer(void *arg) {
    /* O_RDWR (Linux): this end is a writer too, so the FIFO never reads as closed; a reader
     * alone would see end-of-file, and spin, whenever a writer came and went silently. */
    int fd = real_open((const char *)arg, O_RDWR | O_CLOEXEC);
    free(arg);
    if (fd < 0) {
        static const char msg[] = "powerloss shim: cannot open the kill FIFO\n";
        real_write(2, msg, sizeof msg - 1);
        abort();
    }
    char b;
    while (read(fd, &b, 1) != 1) {
        /* EINTR only: with a writer of its own, read blocks until a byte arrives */
    }
    pthread_mutex_lock(&lock);
    kill(getpid(), SIGKILL);
    for (;;) pause();
    return NULL;
}

static void init(void) __attribute__((constructor));
static void init(void) {
    real_open = dlsym(RTLD_NEXT, "open");
    real_open64 = dlsym(RTLD_NEXT, "open64");
    real_openat = dlsym(RTLD_NEXT, "openat");
    real_openat64 = dlsym(RTLD_NEXT, "openat64");
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate");
    real_ftruncate64 = dlsym(RTLD_NEXT, "ftruncate64");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_close = dlsym(RTLD_NEXT, "close");
    real_unlink = dlsym(RTLD_NEXT, "unlink");
    real_unlinkat = dlsym(RTLD_NEXT, "unlinkat");
    real_rename = dlsym(RTLD_NEXT, "rename");
    real_renameat = dlsym(RTLD_NEXT, "renameat");
    real_lseek = dlsym(RTLD_NEXT, "lseek");
    const char *l = getenv("POWERLOSS_LOG");
    const char *d = getenv("POWERLOSS_DIR");
    const char *p = getenv("POWERLOSS_PREFIX");
    const char *s = getenv("POWERLOSS_SKIP_SYNC");
    skip_sync = s && strcmp(s, "1") == 0;
    if (p && strlen(p) < sizeof prefix) strcpy(prefix, p);
    if (!l || !d || strlen(d) >= sizeof dir) return;
    strcpy(dir, d);
    dir_len = strlen(dir);
    while (dir_len > 1 && dir[dir_len - 1] == '/') dir[--dir_len] = 0;
    log_fd = real_open(l, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    const char *k = getenv("POWERLOSS_KILL_FIFO");
    const char *lp = getenv("LISTEN_PID");
    if (k && *k && strlen(k) < 4096 && lp && atol(lp) == (long)getpid()) {
        char *arg = strdup(k);
        pthread_t t;
        if (!arg || pthread_create(&t, NULL, killer, arg) != 0) abort();
        pthread_detach(t);
    }
}

/* One record in one write(): the log is shared with the client, and O_APPEND keeps each
 * write whole. A log that cannot be written makes the run worthless: abort loudly. */
static void emit(uint32_t op, int fd, uint32_t aux, uint64_t off, const void *a, size_t alen,
                 const void *b, size_t blen) {
    if (log_fd < 0) return;
    size_t total = sizeof(struct rec) + alen + blen;
    char *buf = malloc(total);
    if (!buf) abort();
    struct rec r = {MAGIC, op, fd, aux, off, alen + blen};
    memcpy(buf, &r, sizeof r);
    if (alen) memcpy(buf + sizeof r, a, alen);
    if (blen) memcpy(buf + sizeof r + alen, b, blen);
    ssize_t n = real_write(log_fd, buf, total);
    free(buf);
    if (n != (ssize_t)total) {
        static const char msg[] = "powerloss shim: short write to the log\n";
        real_write(2, msg, sizeof msg - 1);
        abort();
    }
}

/* The absolute form of `path` (relative to the cwd, or to `dirfd`). */
static int absolute(int dirfd, const char *path, char *out, size_t cap) {
    if (path[0] == '/') {
        if (strlen(path) >= cap) return -1;
        strcpy(out, path);
        return 0;
    }
    char base[4096];
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base)) return -1;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, base, sizeof base - 1);
        if (n < 0) return -1;
        base[n] = 0;
    }
    if ((size_t)snprintf(out, cap, "%s/%s", base, path) >= cap) return -1;
    return 0;
}

/* 1 for a recorded spool file, 2 for the spool directory, 0 otherwise. */
static int classify(const char *abs) {
    if (log_fd < 0) return 0;
    if (strncmp(abs, dir, dir_len) != 0) return 0;
    const char *rest = abs + dir_len;
    if (*rest == 0) return 2;
    if (*rest != '/') return 0;
    rest++;
    if (strcmp(rest, ".") == 0) return 2;
    if (strchr(rest, '/')) return 0;
    if (strncmp(rest, prefix, strlen(prefix)) != 0) return 0;
    size_t n = strlen(rest);
    if (n >= 4 && strcmp(rest + n - 4, "-shm") == 0) return 0;
    return 1;
}

static int do_open(int use_at, int dirfd, const char *path, int flags, mode_t mode, int is64) {
    char abs[4096];
    int kind = 0;
    if (path && absolute(use_at ? dirfd : AT_FDCWD, path, abs, sizeof abs) == 0)
        kind = classify(abs);
    if (!kind) {
        if (use_at)
            return is64 ? real_openat64(dirfd, path, flags, mode)
                        : real_openat(dirfd, path, flags, mode);
        return is64 ? real_open64(path, flags, mode) : real_open(path, flags, mode);
    }
    pthread_mutex_lock(&lock);
    struct stat st;
    int existed = stat(abs, &st) == 0;
    int fd = use_at ? (is64 ? real_openat64(dirfd, path, flags, mode)
                            : real_openat(dirfd, path, flags, mode))
                    : (is64 ? real_open64(path, flags, mode) : real_open(path, flags, mode));
    int saved = errno;
    if (fd >= 0 && fd < MAX_FD) {
        tracked[fd] = (unsigned char)kind;
        uint32_t aux = 0;
        if (!existed && (flags & O_CREAT)) aux |= 1;
        if (existed && (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY) aux |= 2;
        emit(OP_OPEN, fd, aux | (kind == 2 ? 4 : 0), 0, abs, strlen(abs), NULL, 0);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open(0, AT_FDCWD, path, flags, m, 0);
}
int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open(0, AT_FDCWD, path, flags, m, 1);
}
int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open(1, dirfd, path, flags, m, 0);
}
int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open(1, dirfd, path, flags, m, 1);
}

static int is_file(int fd) { return fd >= 0 && fd < MAX_FD && tracked[fd] == 1; }
static int is_recorded(int fd) { return fd >= 0 && fd < MAX_FD && tracked[fd] != 0; }

static ssize_t do_pwrite(int fd, const void *buf, size_t n, off_t off, int is64) {
    if (!is_file(fd)) return is64 ? real_pwrite64(fd, buf, n, off) : real_pwrite(fd, buf, n, off);
    pthread_mutex_lock(&lock);
    ssize_t got = is64 ? real_pwrite64(fd, buf, n, off) : real_pwrite(fd, buf, n, off);
    int saved = errno;
    if (got > 0) emit(OP_WRITE, fd, 0, (uint64_t)off, buf, (size_t)got, NULL, 0);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return got;
}
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) { return do_pwrite(fd, buf, n, off, 0); }
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) { return do_pwrite(fd, buf, n, off, 1); }

ssize_t write(int fd, const void *buf, size_t n) {
    if (!is_file(fd)) return real_write(fd, buf, n);
    pthread_mutex_lock(&lock);
    off_t off = real_lseek(fd, 0, SEEK_CUR);
    ssize_t got = real_write(fd, buf, n);
    int saved = errno;
    if (got > 0) {
        if (fcntl(fd, F_GETFL) & O_APPEND) off = real_lseek(fd, 0, SEEK_CUR) - got;
        emit(OP_WRITE, fd, 0, (uint64_t)off, buf, (size_t)got, NULL, 0);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
    return got;
}

static int do_ftruncate(int fd, off_t len, int is64) {
    if (!is_file(fd)) return is64 ? real_ftruncate64(fd, len) : real_ftruncate(fd, len);
    pthread_mutex_lock(&lock);
    int rc = is64 ? real_ftruncate64(fd, len) : real_ftruncate(fd, len);
    int saved = errno;
    if (rc == 0) emit(OP_TRUNC, fd, 0, (uint64_t)len, NULL, 0, NULL, 0);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}
int ftruncate(int fd, off_t len) { return do_ftruncate(fd, len, 0); }
int ftruncate64(int fd, off_t len) { return do_ftruncate(fd, len, 1); }

static int do_sync(int fd, int data_only) {
    if (!is_recorded(fd)) return data_only ? real_fdatasync(fd) : real_fsync(fd);
    if (skip_sync) return 0;
    pthread_mutex_lock(&lock);
    int rc = data_only ? real_fdatasync(fd) : real_fsync(fd);
    int saved = errno;
    if (rc == 0) emit(OP_SYNC, fd, (uint32_t)data_only, 0, NULL, 0, NULL, 0);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}
int fsync(int fd) { return do_sync(fd, 0); }
int fdatasync(int fd) { return do_sync(fd, 1); }

int close(int fd) {
    if (!is_recorded(fd)) return real_close(fd);
    pthread_mutex_lock(&lock);
    tracked[fd] = 0;
    emit(OP_CLOSE, fd, 0, 0, NULL, 0, NULL, 0);
    int rc = real_close(fd);
    int saved = errno;
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}

static int do_unlink(int use_at, int dirfd, const char *path, int flags) {
    char abs[4096];
    if (!path || absolute(use_at ? dirfd : AT_FDCWD, path, abs, sizeof abs) != 0 ||
        classify(abs) != 1)
        return use_at ? real_unlinkat(dirfd, path, flags) : real_unlink(path);
    pthread_mutex_lock(&lock);
    int rc = use_at ? real_unlinkat(dirfd, path, flags) : real_unlink(path);
    int saved = errno;
    if (rc == 0) emit(OP_UNLINK, -1, 0, 0, abs, strlen(abs), NULL, 0);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}
int unlink(const char *path) { return do_unlink(0, AT_FDCWD, path, 0); }
int unlinkat(int dirfd, const char *path, int flags) { return do_unlink(1, dirfd, path, flags); }

static int do_rename(int use_at, int ofd, const char *old, int nfd, const char *new) {
    char a[4096], b[4096];
    int ka = old && absolute(use_at ? ofd : AT_FDCWD, old, a, sizeof a) == 0 ? classify(a) : 0;
    int kb = new && absolute(use_at ? nfd : AT_FDCWD, new, b, sizeof b) == 0 ? classify(b) : 0;
    if (ka != 1 && kb != 1)
        return use_at ? real_renameat(ofd, old, nfd, new) : real_rename(old, new);
    pthread_mutex_lock(&lock);
    int rc = use_at ? real_renameat(ofd, old, nfd, new) : real_rename(old, new);
    int saved = errno;
    if (rc == 0) emit(OP_RENAME, -1, 0, 0, a, strlen(a) + 1, b, strlen(b));
    pthread_mutex_unlock(&lock);
    errno = saved;
    return rc;
}
int rename(const char *old, const char *new) { return do_rename(0, AT_FDCWD, old, AT_FDCWD, new); }
int renameat(int ofd, const char *old, int nfd, const char *new) {
    return do_rename(1, ofd, old, nfd, new);
}
