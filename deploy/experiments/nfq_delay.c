// nfq_delay: holds every packet of one NFQUEUE for a fixed delay, then
// accepts it. The emulated links' delay where the kernel has no netem (see
// deploy/experiments/README.md): netns.sh puts one rule
//   iptables-legacy -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num Q
// in each host's namespace and runs one of these there.
//
//   nfq_delay -q QUEUE -d DELAY_US [-n MAX_HELD] [-t SECONDS]
//
// Order is kept: the delay is the same for every packet, so a FIFO releases
// them in arrival order. The number held is bounded (-n, default 65536): a
// packet arriving at a full queue is dropped at once (tail drop, counted),
// as a router's full buffer would. Only the packet id is copied from the
// kernel (COPY_META), and GSO packets arrive whole (NFQA_CFG_F_GSO), so the
// cost per byte stays low at 1 Gbit/s. SIGTERM or SIGINT, or -t seconds
// elapsed (processes stop by themselves), accept whatever is still held,
// print the counts on stderr and exit 0. Build:
//   gcc -O2 -Wall -o nfq_delay nfq_delay.c -lnetfilter_queue -lnfnetlink

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <libnfnetlink/libnfnetlink.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

struct held {
  uint32_t id;
  int64_t release_ns;
};

// The FIFO of held packets (a ring of `capacity`).
static struct held* ring;
static size_t capacity = 65536, head = 0, count = 0;
static int64_t delay_ns;
static unsigned long long accepted = 0, dropped_full = 0, enobufs = 0;
static volatile sig_atomic_t stop = 0;

static int64_t NowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t RealNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void OnSignal(int sig) {
  (void)sig;
  stop = 1;
}

// Called by nfq_handle_packet for each queued packet: hold it, or drop it
// when the FIFO is full.
static int OnPacket(struct nfq_q_handle* qh, struct nfgenmsg* msg, struct nfq_data* nfa,
                    void* data) {
  (void)msg;
  (void)data;
  struct nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
  if (ph == NULL) return 0;
  const uint32_t id = ntohl(ph->packet_id);
  if (count == capacity) {
    ++dropped_full;
    return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
  }
  // The delay counts from the packet's arrival at the host (its receive
  // timestamp, which the kernel takes for every packet while our
  // timestamping socket is open), not from when it reached us: the trip
  // through the queue to this process is part of the emulated latency.
  int64_t held_ns = delay_ns;
  struct timeval arrived;
  if (nfq_get_timestamp(nfa, &arrived) == 0 && arrived.tv_sec != 0) {
    const int64_t age_ns =
        RealNs() - ((int64_t)arrived.tv_sec * 1000000000LL + (int64_t)arrived.tv_usec * 1000);
    if (age_ns > 0) held_ns -= age_ns < delay_ns ? age_ns : delay_ns;
  }
  ring[(head + count) % capacity] = (struct held){id, NowNs() + held_ns};
  ++count;
  return 0;
}

// Accepts every held packet whose time has come (all of them when `all`).
static void Release(struct nfq_q_handle* qh, int all) {
  const int64_t now = NowNs();
  while (count > 0 && (all || ring[head].release_ns <= now)) {
    nfq_set_verdict(qh, ring[head].id, NF_ACCEPT, 0, NULL);
    head = (head + 1) % capacity;
    --count;
    ++accepted;
  }
}

int main(int argc, char** argv) {
  int queue = -1;
  long long delay_us = -1, time_limit_s = 0;
  int opt;
  while ((opt = getopt(argc, argv, "q:d:n:t:")) != -1) {
    switch (opt) {
      case 'q': queue = atoi(optarg); break;
      case 'd': delay_us = atoll(optarg); break;
      case 'n': capacity = strtoull(optarg, NULL, 10); break;
      case 't': time_limit_s = atoll(optarg); break;
      default:
        fprintf(stderr, "usage: nfq_delay -q QUEUE -d DELAY_US [-n MAX_HELD] [-t SECONDS]\n");
        return 2;
    }
  }
  if (queue < 0 || queue > 65535 || delay_us < 0 || capacity == 0) {
    fprintf(stderr, "usage: nfq_delay -q QUEUE -d DELAY_US [-n MAX_HELD] [-t SECONDS]\n");
    return 2;
  }
  delay_ns = delay_us * 1000;
  ring = calloc(capacity, sizeof *ring);
  if (ring == NULL) {
    fprintf(stderr, "nfq_delay: cannot allocate %zu entries\n", capacity);
    return 1;
  }

  // Wake at each release time, not up to the default 50 us of timer slack
  // later (at 1 ms of delay that slack alone was 5 % of it).
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  // A socket asking for receive timestamps makes the kernel stamp every
  // packet it receives (it is never read), so OnPacket knows each one's
  // arrival. Without it the delay counts from when a packet reaches us.
  const int stamper = socket(AF_INET, SOCK_DGRAM, 0);
  const int on = 1;
  if (stamper >= 0) setsockopt(stamper, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);

  // Signals are blocked except inside ppoll, so a SIGTERM between the check
  // of `stop` and the wait cannot be lost.
  sigset_t block, during_wait;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  sigprocmask(SIG_BLOCK, &block, &during_wait);
  sigdelset(&during_wait, SIGTERM);
  sigdelset(&during_wait, SIGINT);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  struct nfq_handle* h = nfq_open();
  if (h == NULL) {
    fprintf(stderr, "nfq_delay: nfq_open failed: %s\n", strerror(errno));
    return 1;
  }
  struct nfq_q_handle* qh = nfq_create_queue(h, (uint16_t)queue, &OnPacket, NULL);
  if (qh == NULL) {
    fprintf(stderr, "nfq_delay: cannot bind queue %d: %s\n", queue, strerror(errno));
    nfq_close(h);
    return 1;
  }
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
    fprintf(stderr, "nfq_delay: cannot set copy mode: %s\n", strerror(errno));
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 1;
  }
  // Whole GSO packets (fewer, larger verdicts); the kernel queue as deep as ours.
  nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
  nfq_set_queue_maxlen(qh, (uint32_t)capacity);
  nfnl_rcvbufsiz(nfq_nfnlh(h), 16 << 20);
  const int fd = nfq_fd(h);
  fprintf(stderr, "nfq_delay: queue %d, delay %lld us, at most %zu held\n", queue, delay_us,
          capacity);

  const int64_t end_ns = time_limit_s > 0 ? NowNs() + time_limit_s * 1000000000LL : 0;
  static char buf[1 << 16];
  while (!stop) {
    const int64_t now = NowNs();
    if (end_ns != 0 && now >= end_ns) {
      fprintf(stderr, "nfq_delay: time limit of %lld s reached\n", time_limit_s);
      break;
    }
    // Wake for the next release, or at most every 200 ms.
    int64_t wait_ns = 200000000LL;
    if (count > 0) wait_ns = ring[head].release_ns - now;
    if (wait_ns < 0) wait_ns = 0;
    struct timespec timeout = {wait_ns / 1000000000LL, wait_ns % 1000000000LL};
    struct pollfd pfd = {fd, POLLIN, 0};
    const int ready = ppoll(&pfd, 1, &timeout, &during_wait);
    if (ready < 0 && errno != EINTR) {
      fprintf(stderr, "nfq_delay: poll failed: %s\n", strerror(errno));
      break;
    }
    if (ready > 0) {
      for (;;) {
        const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
          nfq_handle_packet(h, buf, (int)n);
          continue;
        }
        if (n < 0 && errno == ENOBUFS) {  // the kernel dropped messages; go on
          ++enobufs;
          continue;
        }
        break;  // EAGAIN: nothing more now
      }
    }
    Release(qh, 0);
  }
  Release(qh, 1);
  fprintf(stderr, "nfq_delay: stopped: %llu accepted, %llu dropped (queue full), %llu ENOBUFS\n",
          accepted, dropped_full, enobufs);
  nfq_destroy_queue(qh);
  nfq_close(h);
  free(ring);
  return 0;
}
