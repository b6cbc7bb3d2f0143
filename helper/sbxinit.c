/*
 * camg-sbxinit: the per-sandbox init, spawned by camg-helper.
 *
 * Written in C rather than forked from the Python helper because a forked
 * CPython dirties megabytes of copy-on-write pages (refcounts, gc) per
 * sandbox and a Python fork costs milliseconds here; this process stays at
 * a few hundred KiB and starts in well under a millisecond.
 *
 * argv: hostname scratch lowerdir upper tmpfs_bytes shm_bytes shm_inodes
 *       procs_path...
 *   lowerdir  overlay "lowerdir=" value, already top-first and validated;
 *             a fork's frozen layers are /proc/self/fd/N/... paths of
 *             the descriptors 5.. the helper passed (closed once mounted)
 *   upper     "tmpfs" or a host directory holding upper/ and work/
 *   shm_bytes, shm_inodes  /dev/shm's size= and nr_inodes= (positive; the
 *             helper derives them, helper/config.py Ceilings.shm)
 *   procs     cgroup.procs files to join before unsharing
 * fd 3: SOCK_SEQPACKET control socket to the helper.
 * fd 4 (made here): a detached, read-only clone of the mount that holds
 *   the upper (the scratch tmpfs, or the disk upper), handed to the helper
 *   on 'U' so a fork can stack this upper as a lower (helper/forks.py).
 *
 * Messages to the helper (first byte is the type):
 *   'P' u32 host pid of init    'R' ready    'F' text: setup failed
 *   'X' u32 reqid, i32 wait status          'E' u32 reqid, i32 errno (fork)
 * Messages from the helper:
 *   'E' u32 reqid, u32 uid, u32 gid, u32 cwd_len, u32 argv_len, u32 env_len,
 *       cwd, argv (NUL-separated), env (NUL-separated); SCM_RIGHTS stdin,
 *       stdout, stderr.
 *   'U' -> 'U' with SCM_RIGHTS fd 4 (or 'E' u32 0, i32 errno).
 * EOF on the control socket means the helper is gone: init exits, and the
 * kernel kills every process of the pid namespace with it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#define CTL 3
#define UPPER_FD 4
#define FIRST_LAYER_FD 5
#define MAX_MSG (256 * 1024)
#define MAX_RUNNING 64

extern char **environ;

/* What the sandbox's root keeps: enough to chown, kill and switch users
 * for verifier steps; never SYS_ADMIN (mount), NET_*, MKNOD, PTRACE. */
static const int keep_caps[] = {
    CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL,
    CAP_SETGID, CAP_SETUID, CAP_SETPCAP, CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT,
};

static void send_msg(const void *buf, size_t len) {
    while (send(CTL, buf, len, MSG_NOSIGNAL) < 0 && errno == EINTR)
        ;
}

static void fail(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    int err = errno;
    buf[0] = 'F';
    va_start(ap, fmt);
    int n = vsnprintf(buf + 1, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof buf - 2) n = sizeof buf - 2;
    snprintf(buf + 1 + n, sizeof buf - 1 - n, ": %s", strerror(err));
    send_msg(buf, strlen(buf));
    _exit(1);
}

static void xmount(const char *src, const char *dst, const char *type,
                   unsigned long flags, const char *data) {
    if (mount(src, dst, type, flags, data) < 0) fail("mount %s", dst);
}

static void xmkdir(const char *path, mode_t mode) {
    if (mkdir(path, mode) < 0 && errno != EEXIST) fail("mkdir %s", path);
}

/* Read-only view of a /proc subtree; absent entries are fine (kernel
 * configs differ). */
static void proc_readonly(const char *path) {
    if (mount(path, path, NULL, MS_BIND | MS_REC, NULL) < 0) {
        if (errno == ENOENT) return;
        fail("bind %s", path);
    }
    xmount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

static void proc_mask(const char *path) {
    if (mount("/dev/null", path, NULL, MS_BIND, NULL) < 0 && errno != ENOENT)
        fail("mask %s", path);
}

/* A tmpfs size or nr_inodes of 0 means unlimited: refuse it. */
static unsigned long long positive(const char *what, const char *text) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || v == 0) {
        errno = EINVAL;
        fail("%s %s", what, text);
    }
    return v;
}

static void make_dev(unsigned long long shm_bytes, unsigned long long shm_inodes) {
    static const struct { const char *name; int major, minor; } nodes[] = {
        {"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7},
        {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
    };
    char path[64], opts[128];
    xmkdir("/dev", 0755);
    /* The sandbox's root may write /dev (CAP_DAC_OVERRIDE): its inodes are
     * bounded like its bytes (it holds about 15 entries). */
    xmount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=65536,nr_inodes=256");
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
        snprintf(path, sizeof path, "/dev/%s", nodes[i].name);
        if (mknod(path, S_IFCHR | 0666, makedev(nodes[i].major, nodes[i].minor)) < 0)
            fail("mknod %s", path);
    }
    xmkdir("/dev/pts", 0755);
    xmount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
    if (symlink("pts/ptmx", "/dev/ptmx") < 0) fail("symlink ptmx");
    xmkdir("/dev/shm", 01777);
    /* Bounded in bytes below the memory cgroup (a fill meets ENOSPC, not
     * the OOM killer) and in inodes: without nr_inodes a tmpfs allows half
     * of the host's RAM pages in inodes. */
    snprintf(opts, sizeof opts, "mode=1777,size=%llu,nr_inodes=%llu", shm_bytes, shm_inodes);
    xmount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts);
    if (symlink("/proc/self/fd", "/dev/fd") < 0 || symlink("/proc/self/fd/0", "/dev/stdin") < 0 ||
        symlink("/proc/self/fd/1", "/dev/stdout") < 0 || symlink("/proc/self/fd/2", "/dev/stderr") < 0)
        fail("symlink fd");
}

/* Taken before the overlay is mounted on the scratch (the clone is of the
 * one mount, no submounts) and while init still may: the helper gets it on
 * request, never a command (they close fds >= 3, and init is not
 * dumpable). Read-only: whoever holds it can only read the frozen upper. */
static void upper_handle(const char *dir) {
    int fd = (int)syscall(SYS_open_tree, AT_FDCWD, dir, 1 /* OPEN_TREE_CLONE */ | O_CLOEXEC);
    if (fd < 0) fail("open_tree %s", dir);
    struct { uint64_t set, clr, prop, userns; } attr = {0x1 /* MOUNT_ATTR_RDONLY */, 0, 0, 0};
    if (syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
        fail("read-only upper handle");
    if (fd != UPPER_FD) {
        if (dup3(fd, UPPER_FD, O_CLOEXEC) < 0) fail("dup upper handle");
        close(fd);
    }
}

static void setup_root(const char *scratch, const char *lowerdir, const char *upper,
                       const char *tmpfs_bytes, unsigned long long shm_bytes,
                       unsigned long long shm_inodes) {
    char path[4096], opts[8192], upperdir[4096], workdir[4096];
    /* Modes below are meant literally (0666 devices, 1777 /dev/shm); the
     * helper's umask must not narrow them. Commands set their own. */
    umask(0);
    xmount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    /* One inode per 4 KiB of the size: without nr_inodes a tmpfs allows
     * half of the host's RAM pages in inodes, and millions of empty files
     * would cost kernel memory no byte limit sees. */
    unsigned long long inodes = strtoull(tmpfs_bytes, NULL, 10) / 4096;
    snprintf(opts, sizeof opts, "mode=0700,size=%s,nr_inodes=%llu", tmpfs_bytes,
             inodes < 4096 ? 4096ULL : inodes);
    xmount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, opts);
    if (strcmp(upper, "tmpfs") == 0) {
        snprintf(upperdir, sizeof upperdir, "%s/u", scratch);
        snprintf(workdir, sizeof workdir, "%s/w", scratch);
        xmkdir(upperdir, 0755);
        xmkdir(workdir, 0700);
    } else {
        snprintf(upperdir, sizeof upperdir, "%s/upper", upper);
        snprintf(workdir, sizeof workdir, "%s/work", upper);
    }
    upper_handle(strcmp(upper, "tmpfs") == 0 ? scratch : upper);
    snprintf(path, sizeof path, "%s/r", scratch);
    xmkdir(path, 0755);
    if ((size_t)snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s", lowerdir,
                         upperdir, workdir) >= sizeof opts) {
        errno = E2BIG;
        fail("overlay options");
    }
    xmount("overlay", path, "overlay", MS_NOSUID, opts);
    /* The overlay holds its own clones of the layers now. */
    syscall(SYS_close_range, FIRST_LAYER_FD, ~0U, 0);
    if (chdir(path) < 0) fail("chdir new root");
    if (syscall(SYS_pivot_root, ".", ".") < 0) fail("pivot_root");
    if (umount2(".", MNT_DETACH) < 0) fail("detach old root");
    if (chdir("/") < 0) fail("chdir /");

    xmkdir("/proc", 0555);
    xmount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    make_dev(shm_bytes, shm_inodes);
    static const char *ro[] = {"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"};
    for (size_t i = 0; i < sizeof ro / sizeof ro[0]; i++) proc_readonly(ro[i]);
    static const char *masked[] = {"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"};
    for (size_t i = 0; i < sizeof masked / sizeof masked[0]; i++) proc_mask(masked[i]);
    xmkdir("/sys", 0555);
    xmount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

static void loopback_up(void) {
    struct ifreq ifr;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) fail("socket");
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) fail("get lo flags");
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) fail("set lo up");
    close(s);
}

static void drop_privileges(void) {
    uint64_t keep = 0;
    for (size_t i = 0; i < sizeof keep_caps / sizeof keep_caps[0]; i++) keep |= 1ULL << keep_caps[i];
    for (int cap = 0; cap <= 63; cap++) {
        if (keep & (1ULL << cap)) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) fail("drop cap %d", cap);
    }
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    data[0].effective = data[0].permitted = (uint32_t)keep;
    data[1].effective = data[1].permitted = (uint32_t)(keep >> 32);
    if (syscall(SYS_capset, &hdr, data) < 0) fail("capset");
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) fail("ambient");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) fail("no_new_privs");
    /* Sandbox root must not read init's memory or attach to it. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) fail("dumpable");
}

/* Syscalls no agent command needs and that widen the kernel surface a
 * sandbox can reach (namespaces, keyrings, BPF, io_uring, mounts, module
 * and clock control). Most need capabilities the sandbox lacks anyway;
 * unshare(CLONE_NEWUSER) does not, which is the point of the filter. */
static const int denied_syscalls[] = {
    __NR_keyctl, __NR_add_key, __NR_request_key, __NR_bpf, __NR_perf_event_open,
    __NR_userfaultfd, __NR_kexec_load, __NR_kexec_file_load, __NR_open_by_handle_at,
    __NR_init_module, __NR_finit_module, __NR_delete_module, __NR_mount, __NR_umount2,
    __NR_pivot_root, __NR_swapon, __NR_swapoff, __NR_reboot, __NR_setns, __NR_acct,
    __NR_io_uring_setup, __NR_io_uring_enter, __NR_io_uring_register, __NR_fsopen,
    __NR_fsconfig, __NR_fsmount, __NR_move_mount, __NR_open_tree, __NR_mount_setattr,
    __NR_syslog, __NR_quotactl, __NR_iopl, __NR_ioperm,
};
#define NS_FLAGS (CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | \
                  CLONE_NEWNET | CLONE_NEWCGROUP | 0x00000080 /* CLONE_NEWTIME */)
#define N_DENIED (sizeof denied_syscalls / sizeof denied_syscalls[0])

static void install_seccomp(void) {
    static struct sock_filter prog[9 + 2 * N_DENIED + 7];
    size_t n = 0;
#define EMIT(code, k, jt, jf) (prog[n++] = (struct sock_filter)BPF_JUMP(code, k, jt, jf))
    EMIT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch), 0, 0);
    EMIT(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    EMIT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS, 0, 0);
    EMIT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr), 0, 0);
    /* x32 ABI numbers would dodge every check below. */
    EMIT(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1);
    EMIT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS, 0, 0);
    /* clone3 passes flags in memory BPF cannot read; libc falls back to
     * clone on ENOSYS, whose flags are checked below. */
    EMIT(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 0, 1);
    EMIT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS, 0, 0);
    for (size_t i = 0; i < N_DENIED; i++) {
        EMIT(BPF_JMP | BPF_JEQ | BPF_K, denied_syscalls[i], 0, 1);
        EMIT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM, 0, 0);
    }
    EMIT(BPF_JMP | BPF_JEQ | BPF_K, __NR_unshare, 2, 0);
    EMIT(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 1, 0);
    EMIT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW, 0, 0);
    EMIT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]), 0, 0);
    EMIT(BPF_JMP | BPF_JSET | BPF_K, NS_FLAGS, 0, 1);
    EMIT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM, 0, 0);
    EMIT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW, 0, 0);
#undef EMIT
    struct sock_fprog fprog = {(unsigned short)n, prog};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) < 0) fail("seccomp");
}

static char **split_block(char *block, uint32_t len) {
    size_t n = 0;
    for (uint32_t i = 0; i < len; i++) if (block[i] == '\0') n++;
    char **out = calloc(n + 1, sizeof *out);
    if (!out) return NULL;
    size_t k = 0;
    for (uint32_t i = 0; i < len && k < n; k++) {
        out[k] = block + i;
        i += strlen(block + i) + 1;
    }
    return out;
}

struct running { uint32_t reqid; pid_t pid; };
static struct running running[MAX_RUNNING];

static void reply_status(char type, uint32_t reqid, int32_t value) {
    char buf[9];
    buf[0] = type;
    memcpy(buf + 1, &reqid, 4);
    memcpy(buf + 5, &value, 4);
    send_msg(buf, sizeof buf);
}

static void run_command(char *msg, ssize_t len, int *fds, int nfds) {
    uint32_t h[6];
    if (len < 1 + (ssize_t)sizeof h || nfds != 3) goto bad;
    memcpy(h, msg + 1, sizeof h);
    uint32_t reqid = h[0], uid = h[1], gid = h[2];
    uint64_t need = 1 + sizeof h + (uint64_t)h[3] + h[4] + h[5];
    if (need != (uint64_t)len) goto bad;
    char *cwd = msg + 1 + sizeof h, *argvb = cwd + h[3], *envb = argvb + h[4];
    if (h[3] == 0 || cwd[h[3] - 1] || h[4] == 0 || argvb[h[4] - 1] || (h[5] && envb[h[5] - 1])) goto bad;
    int slot = -1;
    for (int i = 0; i < MAX_RUNNING; i++) if (running[i].pid == 0) { slot = i; break; }
    if (slot < 0) { reply_status('E', reqid, EAGAIN); goto out; }
    pid_t pid = fork();
    if (pid < 0) { reply_status('E', reqid, errno); goto out; }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setsid();
        for (int i = 0; i < 3; i++) if (dup2(fds[i], i) < 0) _exit(126);
        syscall(SYS_close_range, 3, ~0U, 0);
        char **argv = split_block(argvb, h[4]);
        char **envp = h[5] ? split_block(envb, h[5]) : calloc(1, sizeof(char *));
        if (!argv || !envp) _exit(126);
        if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0) {
            dprintf(2, "camg: cannot switch to uid %u\n", uid);
            _exit(126);
        }
        umask(022);
        if (chdir(cwd) < 0) {
            dprintf(2, "camg: cannot change directory to %s: %s\n", cwd, strerror(errno));
            _exit(1);
        }
        environ = envp;
        execvp(argv[0], argv);
        dprintf(2, "camg: cannot execute %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    running[slot].reqid = reqid;
    running[slot].pid = pid;
    goto out;
bad:
    reply_status('E', len >= 5 ? *(uint32_t *)(msg + 1) : 0, EINVAL);
out:
    for (int i = 0; i < nfds; i++) close(fds[i]);
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < MAX_RUNNING; i++) {
            if (running[i].pid != pid) continue;
            /* The command's whole process group goes with it, as an agent
             * shell session would; setsid() daemons are left to the
             * timeout's freezer sweep or destroy. */
            kill(-pid, SIGKILL);
            reply_status('X', running[i].reqid, status);
            running[i].pid = 0;
        }
    }
}

static void send_upper(void) {
    char c = 'U';
    struct iovec iov = {&c, 1};
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    int fd = UPPER_FD;
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    while (sendmsg(CTL, &mh, MSG_NOSIGNAL) < 0) {
        if (errno == EINTR) continue;
        reply_status('E', 0, errno);
        return;
    }
}

static void serve(void) {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) fail("signalfd");
    static char msg[MAX_MSG];
    char cbuf[CMSG_SPACE(sizeof(int) * 3)];
    struct pollfd pfd[2] = {{CTL, POLLIN, 0}, {sfd, POLLIN, 0}};
    static const char ready = 'R';
    send_msg(&ready, 1);
    for (;;) {
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR) continue;
            _exit(2);
        }
        if (pfd[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0)
                ;
            reap();
        }
        if (!pfd[0].revents) continue;
        struct iovec iov = {msg, sizeof msg};
        struct msghdr mh = {0};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof cbuf;
        ssize_t n = recvmsg(CTL, &mh, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) _exit(0);
        int fds[3], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            int k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (int i = 0; i < k; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (nfds < 3) fds[nfds++] = fd; else close(fd);
            }
        }
        if (!(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) && n == 1 && msg[0] == 'U' && nfds == 0) {
            send_upper();
            continue;
        }
        if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || msg[0] != 'E') {
            for (int i = 0; i < nfds; i++) close(fds[i]);
            reply_status('E', 0, EINVAL);
            continue;
        }
        run_command(msg, n, fds, nfds);
    }
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "camg-sbxinit is started by camg-helper only\n");
        return 2;
    }
    /* The helper (Python) ignores SIGPIPE and SIGXFSZ and spawn keeps that
     * across exec; init and every command it forks get the defaults back
     * (`yes | head` must end yes quietly). Init itself sends with
     * MSG_NOSIGNAL. */
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    /* Checked before anything is joined or made. */
    unsigned long long shm_bytes = positive("shm_bytes", argv[6]);
    unsigned long long shm_inodes = positive("shm_inodes", argv[7]);
    for (int i = 8; i < argc; i++) {
        int fd = open(argv[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1) fail("join %s", argv[i]);
        close(fd);
    }
    if (unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWPID) < 0)
        fail("unshare");
    pid_t pid = fork();
    if (pid < 0) fail("fork init");
    if (pid > 0) {
        char buf[5] = {'P'};
        uint32_t p = (uint32_t)pid;
        memcpy(buf + 1, &p, 4);
        send_msg(buf, sizeof buf);
        _exit(0);
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    setup_root(argv[2], argv[3], argv[4], argv[5], shm_bytes, shm_inodes);
    if (sethostname(argv[1], strlen(argv[1])) < 0) fail("sethostname");
    loopback_up();
    drop_privileges();
    install_seccomp();
    serve();
    return 0;
}
