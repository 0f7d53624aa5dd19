/*
 * sluice I/O shim: page-cache-bypassing positional reads into caller memory (the shared wasm arena),
 * served by a small pool of reader threads. Loaded from Deno with Deno.dlopen (see io/shim.ts).
 *
 * Every function returns a negative errno on failure so the TypeScript side can name the cause.
 * Tickets: a read's ticket encodes its slot (low SIO_SLOT_BITS bits) and a per-slot sequence, so
 * a stale or unknown ticket is detected instead of aliasing a newer read.
 *
 * Reader threads must be joined before the process exits (a live thread in an unloaded library
 * crashed Deno at exit), so sio_queue_destroy joins them and a library destructor joins any queue
 * the caller forgot.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define SIO_SLOT_BITS 12
#define SIO_MAX_SLOTS (1 << SIO_SLOT_BITS)
#define SIO_MAX_THREADS 64

/* Priority classes: 0 a read the engine waits for now, 1 a read-ahead, 2 a speculative read. */
#define SIO_CLASSES 3

enum slot_state { SLOT_FREE = 0, SLOT_QUEUED, SLOT_RUNNING, SLOT_DONE };

typedef struct {
  int state;
  int64_t ticket;
  int fd;
  uint8_t *dst;
  uint64_t len;
  int64_t off;
  int64_t result; /* bytes read (may be short at end of file) or -errno */
  int cls;        /* priority class while queued */
  int held;       /* a speculative read of a held file, queued in no ring (see FAULT_HOLD) */
} sio_slot;

typedef struct sio_queue {
  pthread_mutex_t mu;
  pthread_cond_t work;    /* a request was queued, or stop */
  pthread_cond_t done;    /* a request completed */
  int stop;
  int nthreads;
  int capacity;
  pthread_t threads[SIO_MAX_THREADS];
  sio_slot *slots;
  int *free_list; /* stack of free slot indices */
  int nfree;
  /* One ring of queued slot indices per priority class; workers serve the most urgent class
   * first and each class oldest first. */
  int *fifo[SIO_CLASSES];
  int fifo_head[SIO_CLASSES];
  int fifo_len[SIO_CLASSES];
  int queued; /* sum of fifo_len */
  int urgent_running; /* reads of the classes above the last one being served right now */
  int spec_running;   /* reads of the last class being served right now */
  /* Disk accounting for the lookahead's cost-benefit gate (see sio_stats): time with any read
   * running, disk time guesses held from urgent reads, bytes completed. */
  int64_t busy_ns, blocked_ns, bytes_done, last_ns;
  int64_t next_seq;
  struct sio_queue *next_live; /* registry for the unload destructor */
} sio_queue;

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static sio_queue *live_queues = NULL;

/* Fault injection for tests, off unless SLUICE_FAULTS is set when the first file is opened:
 * rules separated by ';', each KIND[=MS]@FILE[:OFFSET] — KIND eio, enospc (the read fails with
 * that errno), short (it returns half the bytes), delay=MS (it sleeps first) or hold (a speculative
 * read starts only once it is waited for, moved to another class or the queue stops, so a test
 * knows every guess is still unstarted when the engine settles it); FILE a substring of the opened
 * path; OFFSET a byte the request must cover (default: every request). */
#define SIO_MAX_FAULTS 16
#define SIO_FAULT_FDS 4096
enum { FAULT_EIO = 1, FAULT_ENOSPC, FAULT_SHORT, FAULT_DELAY, FAULT_HOLD };
typedef struct {
  int kind;
  int64_t ms;
  int64_t at; /* -1: any request */
  char file[200];
} sio_fault;
static sio_fault faults[SIO_MAX_FAULTS];
static int nfaults = 0;
static pthread_once_t faults_once = PTHREAD_ONCE_INIT;
/* Bit r set: rule r applies to the file open on this fd (written at open, read by readers). */
static uint32_t fd_faults[SIO_FAULT_FDS];

static void parse_faults(void) {
  const char *env = getenv("SLUICE_FAULTS");
  if (!env) return;
  char buf[2048];
  strncpy(buf, env, sizeof buf - 1);
  buf[sizeof buf - 1] = 0;
  char *save = NULL;
  for (char *rule = strtok_r(buf, ";", &save); rule && nfaults < SIO_MAX_FAULTS;
       rule = strtok_r(NULL, ";", &save)) {
    char *atsign = strchr(rule, '@');
    if (!atsign) continue;
    *atsign = 0;
    sio_fault f = {0, 0, -1, {0}};
    char *eq = strchr(rule, '=');
    if (eq) {
      *eq = 0;
      f.ms = strtoll(eq + 1, NULL, 10);
    }
    if (strcmp(rule, "eio") == 0) f.kind = FAULT_EIO;
    else if (strcmp(rule, "enospc") == 0) f.kind = FAULT_ENOSPC;
    else if (strcmp(rule, "short") == 0) f.kind = FAULT_SHORT;
    else if (strcmp(rule, "delay") == 0) f.kind = FAULT_DELAY;
    else if (strcmp(rule, "hold") == 0) f.kind = FAULT_HOLD;
    else continue;
    char *colon = strrchr(atsign + 1, ':');
    if (colon) {
      *colon = 0;
      f.at = strtoll(colon + 1, NULL, 10);
    }
    strncpy(f.file, atsign + 1, sizeof f.file - 1);
    faults[nfaults++] = f;
  }
}

/* The injected outcome of a read of [off, off + len) on fd: 0 to read normally (after any delay),
 * a negative errno to fail, or 1 to return a short count. */
static int injected_fault(int fd, uint64_t len, int64_t off) {
  if (fd < 0 || fd >= SIO_FAULT_FDS || fd_faults[fd] == 0) return 0;
  int outcome = 0;
  for (int r = 0; r < nfaults; r++) {
    if (!(fd_faults[fd] & (1u << r))) continue;
    const sio_fault *f = &faults[r];
    if (f->at >= 0 && (f->at < off || f->at >= off + (int64_t)len)) continue;
    if (f->kind == FAULT_DELAY) usleep((useconds_t)(f->ms * 1000));
    else if (f->kind == FAULT_EIO) outcome = -EIO;
    else if (f->kind == FAULT_ENOSPC) outcome = -ENOSPC;
    else if (f->kind == FAULT_SHORT && outcome == 0) outcome = 1;
  }
  return outcome;
}

/* 1 when a hold rule applies to a read of [off, off + len) on fd. */
static int held_read(int fd, uint64_t len, int64_t off) {
  if (fd < 0 || fd >= SIO_FAULT_FDS || fd_faults[fd] == 0) return 0;
  for (int r = 0; r < nfaults; r++) {
    const sio_fault *f = &faults[r];
    if (!(fd_faults[fd] & (1u << r)) || f->kind != FAULT_HOLD) continue;
    if (f->at < 0 || (f->at >= off && f->at < off + (int64_t)len)) return 1;
  }
  return 0;
}

/* Opens `path` read-only. direct != 0 bypasses the page cache: O_DIRECT on Linux (EINVAL when the
 * filesystem refuses it, e.g. tmpfs; the caller then reopens buffered), F_NOCACHE on macOS. */
int32_t sio_open(const char *path, int32_t direct) {
  int flags = O_RDONLY | O_CLOEXEC;
#ifdef O_DIRECT
  if (direct) flags |= O_DIRECT;
#endif
  int fd = open(path, flags);
  if (fd < 0) return -errno;
  pthread_once(&faults_once, parse_faults);
  if (fd < SIO_FAULT_FDS) {
    uint32_t mask = 0;
    for (int r = 0; r < nfaults; r++) {
      if (strstr(path, faults[r].file)) mask |= 1u << r;
    }
    fd_faults[fd] = mask;
  }
#if defined(__APPLE__) && defined(F_NOCACHE)
  if (direct && fcntl(fd, F_NOCACHE, 1) != 0) {
    int err = errno;
    close(fd);
    return -err;
  }
#endif
  return fd;
}

/* 1 when this build can bypass the page cache at all. */
int32_t sio_direct_supported(void) {
#if defined(O_DIRECT) || (defined(__APPLE__) && defined(F_NOCACHE))
  return 1;
#else
  return 0;
#endif
}

/* Asks for transparent huge pages over the whole pages of [addr, addr + len), the memory the reads
 * fill: O_DIRECT pins every page of a request, and faulting in fresh 4 KiB pages inside the read
 * halved its rate. Returns 0, or -errno where the kernel refuses (THP disabled: the reads still
 * work on 4 KiB pages). */
int32_t sio_advise_huge(void *addr, uint64_t len) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)addr + page - 1) & ~(page - 1);
  uintptr_t hi = ((uintptr_t)addr + (uintptr_t)len) & ~(page - 1);
  if (hi <= lo) return 0;
  return madvise((void *)lo, hi - lo, MADV_HUGEPAGE) == 0 ? 0 : -errno;
#else
  (void)addr;
  (void)len;
  return -ENOSYS;
#endif
}

/* Text for a positive errno value (called from the JS thread only). */
const char *sio_strerror(int32_t err) { return strerror(err); }

int32_t sio_close(int32_t fd) {
  if (fd >= 0 && fd < SIO_FAULT_FDS) fd_faults[fd] = 0;
  return close(fd) == 0 ? 0 : -errno;
}

int64_t sio_file_size(int32_t fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  return (int64_t)st.st_size;
}

/* Reads until `len` bytes arrived or end of file; returns the count (short only at end of file)
 * or -errno. A short pread away from end of file is retried; one that ends at end of file stops
 * the loop, since O_DIRECT would reject the now unaligned continuation with EINVAL. */
int64_t sio_pread(int32_t fd, void *dst, uint64_t len, int64_t off) {
  int fault = injected_fault(fd, len, off);
  if (fault < 0) return fault;
  if (fault == 1) len /= 2;
  uint8_t *p = (uint8_t *)dst;
  uint64_t got = 0;
  while (got < len) {
    ssize_t n = pread(fd, p + got, (size_t)(len - got), (off_t)(off + (int64_t)got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    got += (uint64_t)n;
    if (got < len) {
      struct stat st;
      if (fstat(fd, &st) != 0) return -errno;
      if (off + (int64_t)got >= (int64_t)st.st_size) break;
    }
  }
  return (int64_t)got;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Adds the time since the last change of the queue's state to its counters; call with the mutex
 * held before every change (submit, start, finish, withdraw). While the engine wants the disk (an
 * urgent read queued or running), the running speculative reads' share of the running reads is
 * the share of the disk they hold from it: all of it when urgent reads wait for a thread, half of
 * it when one guess shares the disk with one urgent read. */
static void account(sio_queue *q) {
  int64_t t = now_ns();
  int64_t dt = q->last_ns > 0 ? t - q->last_ns : 0;
  q->last_ns = t;
  int running = q->urgent_running + q->spec_running;
  if (running > 0) q->busy_ns += dt;
  int urgent_queued = q->queued - q->fifo_len[SIO_CLASSES - 1];
  if (q->spec_running > 0 && (urgent_queued > 0 || q->urgent_running > 0)) {
    q->blocked_ns += urgent_queued > 0 && q->urgent_running == 0
                         ? dt
                         : dt * q->spec_running / running;
  }
}

/* Removes queued slot `i` from its class's ring (keeping the others' order). */
static void unqueue(sio_queue *q, int i) {
  int c = q->slots[i].cls;
  int n = q->fifo_len[c];
  for (int k = 0; k < n; k++) {
    int at = (q->fifo_head[c] + k) % q->capacity;
    if (q->fifo[c][at] != i) continue;
    for (int m = k; m + 1 < n; m++) {
      q->fifo[c][(q->fifo_head[c] + m) % q->capacity] =
          q->fifo[c][(q->fifo_head[c] + m + 1) % q->capacity];
    }
    q->fifo_len[c]--;
    q->queued--;
    return;
  }
}

static void enqueue(sio_queue *q, int i, int c) {
  q->slots[i].cls = c;
  q->fifo[c][(q->fifo_head[c] + q->fifo_len[c]) % q->capacity] = i;
  q->fifo_len[c]++;
  q->queued++;
}

/* Queues held slot `i` in its class, where reader threads find it. */
static void release(sio_queue *q, int i) {
  sio_slot *s = &q->slots[i];
  if (s->state != SLOT_QUEUED || !s->held) return;
  account(q);
  s->held = 0;
  enqueue(q, i, s->cls);
  pthread_cond_broadcast(&q->work);
}

static void *reader_main(void *arg) {
  sio_queue *q = (sio_queue *)arg;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    /* A speculative read (the last class) starts only when no more urgent read is queued or
     * running, so a guess never shares the disk with a read the engine waits for. */
    int c = -1;
    for (;;) {
      c = 0;
      while (c < SIO_CLASSES && q->fifo_len[c] == 0) c++;
      if (c < SIO_CLASSES - 1 || (c == SIO_CLASSES - 1 && q->urgent_running == 0)) break;
      if (q->stop && q->queued == 0) break;
      if (q->stop && c == SIO_CLASSES - 1) break;
      pthread_cond_wait(&q->work, &q->mu);
    }
    if (c == SIO_CLASSES) break; /* stop requested and nothing left to serve */
    account(q);
    if (c < SIO_CLASSES - 1) q->urgent_running++;
    else q->spec_running++;
    int i = q->fifo[c][q->fifo_head[c]];
    q->fifo_head[c] = (q->fifo_head[c] + 1) % q->capacity;
    q->fifo_len[c]--;
    q->queued--;
    sio_slot *s = &q->slots[i];
    s->state = SLOT_RUNNING;
    int fd = s->fd;
    uint8_t *dst = s->dst;
    uint64_t len = s->len;
    int64_t off = s->off;
    pthread_mutex_unlock(&q->mu);
    int64_t r = sio_pread(fd, dst, len, off);
    pthread_mutex_lock(&q->mu);
    account(q);
    s->result = r;
    s->state = SLOT_DONE;
    if (r > 0) q->bytes_done += r;
    if (c == SIO_CLASSES - 1) q->spec_running--;
    else if (--q->urgent_running == 0 && q->fifo_len[SIO_CLASSES - 1] > 0) {
      pthread_cond_broadcast(&q->work);
    }
    pthread_cond_broadcast(&q->done);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

static void stop_and_join(sio_queue *q) {
  pthread_mutex_lock(&q->mu);
  q->stop = 1;
  for (int i = 0; i < q->capacity; i++) release(q, i);
  pthread_cond_broadcast(&q->work);
  pthread_mutex_unlock(&q->mu);
  for (int t = 0; t < q->nthreads; t++) pthread_join(q->threads[t], NULL);
  q->nthreads = 0;
}

static void free_queue(sio_queue *q) {
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->work);
  pthread_cond_destroy(&q->done);
  free(q->slots);
  free(q->free_list);
  for (int c = 0; c < SIO_CLASSES; c++) free(q->fifo[c]);
  free(q);
}

/* Creates a queue served by `nthreads` reader threads with room for `capacity` unreaped reads.
 * Returns the queue, or NULL with *err set to a negative errno. */
sio_queue *sio_queue_create(int32_t nthreads, int32_t capacity, int32_t *err) {
  *err = 0;
  if (nthreads < 1 || nthreads > SIO_MAX_THREADS || capacity < 1 || capacity > SIO_MAX_SLOTS) {
    *err = -EINVAL;
    return NULL;
  }
  sio_queue *q = calloc(1, sizeof *q);
  if (!q) {
    *err = -ENOMEM;
    return NULL;
  }
  q->capacity = capacity;
  q->slots = calloc((size_t)capacity, sizeof *q->slots);
  q->free_list = calloc((size_t)capacity, sizeof *q->free_list);
  int rings_ok = 1;
  for (int c = 0; c < SIO_CLASSES; c++) {
    q->fifo[c] = calloc((size_t)capacity, sizeof *q->fifo[c]);
    if (!q->fifo[c]) rings_ok = 0;
  }
  if (!q->slots || !q->free_list || !rings_ok) {
    free(q->slots);
    free(q->free_list);
    for (int c = 0; c < SIO_CLASSES; c++) free(q->fifo[c]);
    free(q);
    *err = -ENOMEM;
    return NULL;
  }
  for (int i = 0; i < capacity; i++) q->free_list[i] = capacity - 1 - i;
  q->nfree = capacity;
  q->next_seq = 1;
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->work, NULL);
  pthread_cond_init(&q->done, NULL);
  for (int t = 0; t < nthreads; t++) {
    int rc = pthread_create(&q->threads[t], NULL, reader_main, q);
    if (rc != 0) {
      stop_and_join(q);
      free_queue(q);
      *err = -rc;
      return NULL;
    }
    q->nthreads = t + 1;
  }
  pthread_mutex_lock(&live_mu);
  q->next_live = live_queues;
  live_queues = q;
  pthread_mutex_unlock(&live_mu);
  return q;
}

/* Queues a read of `len` bytes at file offset `off` into `dst` in priority class `prio` (0 most
 * urgent; clamped to the classes). Returns a ticket (> 0), or -EAGAIN when all `capacity` slots
 * hold reads not yet reaped by sio_wait. Never blocks. */
int64_t sio_submit(sio_queue *q, int32_t fd, void *dst, uint64_t len, int64_t off, int32_t prio) {
  int c = prio < 0 ? 0 : prio >= SIO_CLASSES ? SIO_CLASSES - 1 : prio;
  pthread_mutex_lock(&q->mu);
  if (q->stop) {
    pthread_mutex_unlock(&q->mu);
    return -ESHUTDOWN;
  }
  if (q->nfree == 0) {
    pthread_mutex_unlock(&q->mu);
    return -EAGAIN;
  }
  int i = q->free_list[--q->nfree];
  sio_slot *s = &q->slots[i];
  s->ticket = (q->next_seq++ << SIO_SLOT_BITS) | i;
  s->fd = fd;
  s->dst = (uint8_t *)dst;
  s->len = len;
  s->off = off;
  s->result = 0;
  s->state = SLOT_QUEUED;
  account(q);
  s->held = c == SIO_CLASSES - 1 && held_read(fd, len, off);
  if (s->held) s->cls = c;
  else enqueue(q, i, c);
  int64_t ticket = s->ticket;
  pthread_cond_signal(&q->work);
  pthread_mutex_unlock(&q->mu);
  return ticket;
}

/* The slot holding `ticket`, or NULL when the ticket is unknown or already reaped. */
static sio_slot *slot_of(sio_queue *q, int64_t ticket) {
  if (ticket <= 0) return NULL;
  int64_t i = ticket & (SIO_MAX_SLOTS - 1);
  if (i >= q->capacity) return NULL;
  sio_slot *s = &q->slots[i];
  return (s->state != SLOT_FREE && s->ticket == ticket) ? s : NULL;
}

/* 0 while the read is pending, 1 once it completed (reap it with sio_wait), -errno when it failed,
 * -ENOENT for an unknown or already reaped ticket. */
int32_t sio_poll(sio_queue *q, int64_t ticket) {
  pthread_mutex_lock(&q->mu);
  sio_slot *s = slot_of(q, ticket);
  int32_t r;
  if (!s) r = -ENOENT;
  else if (s->state != SLOT_DONE) r = 0;
  else r = s->result < 0 ? (int32_t)s->result : 1;
  pthread_mutex_unlock(&q->mu);
  return r;
}

/* Blocks until the read completes, frees its slot and returns the bytes read (short only at end of
 * file) or -errno; -ENOENT for an unknown or already reaped ticket. */
int64_t sio_wait(sio_queue *q, int64_t ticket) {
  pthread_mutex_lock(&q->mu);
  sio_slot *s = slot_of(q, ticket);
  if (!s) {
    pthread_mutex_unlock(&q->mu);
    return -ENOENT;
  }
  release(q, (int)(s - q->slots));
  while (s->state != SLOT_DONE) pthread_cond_wait(&q->done, &q->mu);
  int64_t r = s->result;
  s->state = SLOT_FREE;
  q->free_list[q->nfree++] = (int)(s - q->slots);
  pthread_mutex_unlock(&q->mu);
  return r;
}

/* Moves a read that has not started to class `prio` (at the end of its ring): a speculative read
 * the engine now waits for becomes urgent. Returns 1 when moved, 0 when it already started or
 * finished or is in that class, -ENOENT for an unknown or already reaped ticket. */
int32_t sio_reclass(sio_queue *q, int64_t ticket, int32_t prio) {
  int c = prio < 0 ? 0 : prio >= SIO_CLASSES ? SIO_CLASSES - 1 : prio;
  pthread_mutex_lock(&q->mu);
  sio_slot *s = slot_of(q, ticket);
  int32_t r = 0;
  if (!s) r = -ENOENT;
  else if (s->state == SLOT_QUEUED && s->cls != c) {
    account(q);
    int i = (int)(s - q->slots);
    if (s->held) s->held = 0;
    else unqueue(q, i);
    enqueue(q, i, c);
    pthread_cond_broadcast(&q->work);
    r = 1;
  }
  pthread_mutex_unlock(&q->mu);
  return r;
}

/* Withdraws a read that has not started: returns 1 and frees its slot (the ticket is then
 * unknown), 0 when it already started or finished (wait for it as usual), -ENOENT for an unknown
 * or already reaped ticket. */
int32_t sio_cancel(sio_queue *q, int64_t ticket) {
  pthread_mutex_lock(&q->mu);
  sio_slot *s = slot_of(q, ticket);
  int32_t r = 0;
  if (!s) r = -ENOENT;
  else if (s->state == SLOT_QUEUED) {
    account(q);
    int i = (int)(s - q->slots);
    if (!s->held) unqueue(q, i);
    s->state = SLOT_FREE;
    q->free_list[q->nfree++] = i;
    r = 1;
  }
  pthread_mutex_unlock(&q->mu);
  return r;
}

/* Disk accounting since the queue was made, into out[0..3]: nanoseconds with any read running,
 * nanoseconds of disk time speculative reads held while a more urgent read was queued or running
 * (see account), bytes completed, and the clock now. */
void sio_stats(sio_queue *q, int64_t *out) {
  pthread_mutex_lock(&q->mu);
  account(q);
  out[0] = q->busy_ns;
  out[1] = q->blocked_ns;
  out[2] = q->bytes_done;
  out[3] = q->last_ns;
  pthread_mutex_unlock(&q->mu);
}

/* Finishes queued reads, joins the reader threads and frees the queue. */
void sio_queue_destroy(sio_queue *q) {
  pthread_mutex_lock(&live_mu);
  for (sio_queue **p = &live_queues; *p; p = &(*p)->next_live) {
    if (*p == q) {
      *p = q->next_live;
      break;
    }
  }
  pthread_mutex_unlock(&live_mu);
  stop_and_join(q);
  free_queue(q);
}

/* Safety net for a caller that exits or unloads the library without destroying its queues. */
__attribute__((destructor)) static void join_live_queues(void) {
  pthread_mutex_lock(&live_mu);
  sio_queue *q = live_queues;
  live_queues = NULL;
  pthread_mutex_unlock(&live_mu);
  while (q) {
    sio_queue *next = q->next_live;
    stop_and_join(q);
    q = next;
  }
}
