// UCX 1.13 probe: 2 processes, worker-address exchange via files, UCP tag API.
// Build: g++ -std=c++20 -O2 probe.cpp -o probe -lucp -lucs
// Run:   ./probe launch <test>     (test: info|lat|bw|kill|probe|efd)
// Env:   PEER=1|0 (UCP_ERR_HANDLING_MODE_PEER or NONE, default 1)
//        THREAD=multi|single (default multi), WAIT=poll|busy (efd test)
//        KILL_SEND=1 (kill test: B also keeps sending to A after the kill)
//        plus any UCX_* variables (inherited by both ranks).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

static double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double cpu_s() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}
#define CHECK(x)                                                                   \
  do {                                                                             \
    ucs_status_t _s = (x);                                                         \
    if (_s != UCS_OK) {                                                            \
      fprintf(stderr, "[r%d] %s failed: %s\n", g_rank, #x, ucs_status_string(_s)); \
      exit(2);                                                                     \
    }                                                                              \
  } while (0)

static int g_rank = -1;
static ucp_context_h g_ctx;
static ucp_worker_h g_w;
static ucp_ep_h g_ep;
static std::string g_dir;
static bool g_peer_err = true;
static bool g_wakeup = false;
static volatile bool g_err_fired = false;
static double g_err_time = 0;
static ucs_status_t g_err_status = UCS_OK;
static double g_t_kill = 0;

#define LOG(...)                                          \
  do {                                                    \
    char _b[1024];                                        \
    int _n = snprintf(_b, sizeof _b, "[r%d] ", g_rank);   \
    _n += snprintf(_b + _n, sizeof _b - _n, __VA_ARGS__); \
    write(1, _b, _n);                                     \
  } while (0)

static const uint64_t SRC_SHIFT = 32, ANY_SRC_MASK = 0xffffffffull, FULL_MASK = ~0ull;
static uint64_t mktag(int src, uint32_t t) {
  return ((uint64_t)src << SRC_SHIFT) | t;
}

static void err_cb(void*, ucp_ep_h ep, ucs_status_t st) {
  g_err_fired = true;
  g_err_time = now_s();
  g_err_status = st;
  LOG("ERR_CB ep=%p status=%s (%d) t_since_kill=%.3f s\n", (void*)ep, ucs_status_string(st), st,
      g_t_kill ? g_err_time - g_t_kill : -1.0);
}

static void write_file(const std::string& name, const void* buf, size_t len) {
  std::string tmp = g_dir + "/" + name + ".tmp", fin = g_dir + "/" + name;
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, buf, len) != (ssize_t)len) {
    perror("write");
    exit(2);
  }
  fsync(fd);
  close(fd);
  if (rename(tmp.c_str(), fin.c_str())) {
    perror("rename");
    exit(2);
  }
}
static std::vector<char> read_file_wait(const std::string& name, double timeout = 30) {
  std::string fin = g_dir + "/" + name;
  double t0 = now_s();
  for (;;) {
    int fd = open(fin.c_str(), O_RDONLY);
    if (fd >= 0) {
      struct stat st;
      fstat(fd, &st);
      std::vector<char> v(st.st_size);
      if (read(fd, v.data(), v.size()) != (ssize_t)v.size()) {
        perror("read");
        exit(2);
      }
      close(fd);
      return v;
    }
    if (now_s() - t0 > timeout) {
      LOG("timeout waiting for %s\n", fin.c_str());
      exit(3);
    }
    usleep(1000);
  }
}

// Wait for request with progress; returns final status (UCS_ERR_TIMED_OUT if not done).
static ucs_status_t wait_req(void* req, double timeout = 30, ucp_tag_recv_info_t* info = nullptr) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  double t0 = now_s();
  ucs_status_t st;
  for (;;) {
    ucp_worker_progress(g_w);
    st = info ? ucp_tag_recv_request_test(req, info) : ucp_request_check_status(req);
    if (st != UCS_INPROGRESS) break;
    if (now_s() - t0 > timeout) return UCS_ERR_TIMED_OUT;  // caller still owns req
  }
  ucp_request_free(req);
  return st;
}
static void* send_nb(const void* buf, size_t len, uint64_t tag) {
  ucp_request_param_t p{};
  return ucp_tag_send_nbx(g_ep, buf, len, tag, &p);
}
static void* recv_nb(void* buf, size_t len, uint64_t tag, uint64_t mask) {
  ucp_request_param_t p{};
  return ucp_tag_recv_nbx(g_w, buf, len, tag, mask, &p);
}
static void send_b(const void* buf, size_t len, uint32_t t) {
  ucs_status_t st = wait_req(send_nb(buf, len, mktag(g_rank, t)));
  if (st != UCS_OK) {
    LOG("send failed: %s\n", ucs_status_string(st));
    exit(4);
  }
}
static size_t recv_b(void* buf, size_t len, uint32_t t) {
  ucp_tag_recv_info_t info{};
  void* r = recv_nb(buf, len, mktag(1 - g_rank, t), FULL_MASK);
  ucs_status_t st = wait_req(r, 30, &info);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) st = UCS_PTR_STATUS(r);
  if (st != UCS_OK) {
    LOG("recv failed: %s\n", ucs_status_string(st));
    exit(4);
  }
  return info.length;
}

static void print_ep() {
  char* b = nullptr;
  size_t n = 0;
  FILE* f = open_memstream(&b, &n);
  ucp_ep_print_info(g_ep, f);
  fclose(f);
  std::string s = std::string("[r") + std::to_string(g_rank) + "] ep info:\n" + b;
  write(1, s.data(), s.size());
  free(b);
}

static void setup(bool wakeup) {
  g_wakeup = wakeup;
  ucp_config_t* cfg;
  CHECK(ucp_config_read(nullptr, nullptr, &cfg));
  if (getenv("PROG_CFG") &&
      atoi(getenv("PROG_CFG"))) {  // set shm error-handling knobs from code instead of env
    ucs_status_t a = ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y");
    ucs_status_t b = ucp_config_modify(cfg, "MEMORY_INVALIDATE", "y");
    if (getenv("PROG_KA")) CHECK(ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", getenv("PROG_KA")));
    if (g_rank == 0)
      LOG("ucp_config_modify MM_ERROR_HANDLING=%s MEMORY_INVALIDATE=%s\n", ucs_status_string(a),
          ucs_status_string(b));
  }
  ucp_params_t pp{};
  pp.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  pp.features = UCP_FEATURE_TAG | (wakeup ? UCP_FEATURE_WAKEUP : 0);
  pp.mt_workers_shared = 0;
  CHECK(ucp_init(&pp, cfg, &g_ctx));
  ucp_config_release(cfg);
  const char* tm = getenv("THREAD");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = (tm && !strcmp(tm, "single")) ? UCS_THREAD_MODE_SINGLE : UCS_THREAD_MODE_MULTI;
  CHECK(ucp_worker_create(g_ctx, &wp, &g_w));
  ucp_worker_attr_t wa{};
  wa.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
  ucp_worker_query(g_w, &wa);
  ucp_address_t* addr;
  size_t alen;
  CHECK(ucp_worker_get_address(g_w, &addr, &alen));
  if (g_rank == 0)
    LOG("worker thread_mode=%d addr_len=%zu peer_err=%d\n", wa.thread_mode, alen, g_peer_err);
  int pid = getpid();
  write_file("pid." + std::to_string(g_rank), &pid, sizeof pid);
  write_file("addr." + std::to_string(g_rank), addr, alen);
  ucp_worker_release_address(g_w, addr);
  auto peer = read_file_wait("addr." + std::to_string(1 - g_rank));
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = (const ucp_address_t*)peer.data();
  if (g_peer_err) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = err_cb;
    ep.err_handler.arg = nullptr;
  }
  double t0 = now_s();
  CHECK(ucp_ep_create(g_w, &ep, &g_ep));
  // handshake: both directions
  uint64_t x = 42;
  if (g_rank == 0) {
    send_b(&x, 8, 1);
    recv_b(&x, 8, 1);
  } else {
    recv_b(&x, 8, 1);
    send_b(&x, 8, 1);
  }
  if (g_rank == 0) LOG("ep create + handshake %.3f ms\n", (now_s() - t0) * 1e3);
}

static void teardown() {
  if (!g_err_fired) {  // sync both sides before closing
    uint64_t x = 0;
    if (g_rank == 0) {
      send_b(&x, 8, 99);
      recv_b(&x, 8, 99);
    } else {
      recv_b(&x, 8, 99);
      send_b(&x, 8, 99);
    }
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = g_err_fired ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_t st = wait_req(ucp_ep_close_nbx(g_ep, &p), 10);
  if (st != UCS_OK) LOG("ep close: %s\n", ucs_status_string(st));
  ucp_worker_destroy(g_w);
  ucp_cleanup(g_ctx);
}

static double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[(size_t)(q * (v.size() - 1))];
}
static void test_lat() {
  char b[8] = {};
  const int warm = 100, iters = 1000;
  double t0 = 0;
  std::vector<double> rtt;
  for (int i = 0; i < warm + iters; i++) {
    if (i == warm) t0 = now_s();
    double ti = now_s();
    if (g_rank == 0) {
      send_b(b, 8, 10);
      recv_b(b, 8, 11);
    } else {
      recv_b(b, 8, 10);
      send_b(b, 8, 11);
    }
    if (i >= warm) rtt.push_back((now_s() - ti) * 1e6 / 2);
  }
  if (g_rank == 0)
    LOG("LAT 8B one-way (RTT/2) us: mean %.2f  median %.2f  p10 %.2f  p90 %.2f  (%d iters)\n",
        (now_s() - t0) / iters / 2 * 1e6, pct(rtt, .5), pct(rtt, .1), pct(rtt, .9), iters);
}

static void test_bw() {
  const size_t sz = 4 << 20;
  const int warm = 5, iters = 50;
  std::vector<char> buf(sz, g_rank ? 0 : 'a');
  uint64_t ack = 0;
  double t0 = 0;
  std::vector<double> per;
  for (int i = 0; i < warm + iters; i++) {
    if (i == warm) {  // sync before timing
      if (g_rank == 0) {
        recv_b(&ack, 8, 21);
        t0 = now_s();
      } else
        send_b(&ack, 8, 21);
    }
    double ti = now_s();
    if (g_rank == 0)
      send_b(buf.data(), sz, 20);
    else
      recv_b(buf.data(), sz, 20);
    if (i >= warm) per.push_back(sz / (now_s() - ti) / 1e6);
  }
  if (g_rank == 1)
    send_b(&ack, 8, 22);
  else
    recv_b(&ack, 8, 22);
  double dt = now_s() - t0;
  if (g_rank == 0)
    LOG("BW 4MiB x%d (1 in flight): aggregate %.1f MB/s, per-msg median %.1f p90 %.1f MB/s\n",
        iters, sz * (double)iters / dt / 1e6, pct(per, .5), pct(per, .9));
  // windowed variant: all 50 in flight
  if (g_rank == 1)
    send_b(&ack, 8, 23);
  else
    recv_b(&ack, 8, 23);
  std::vector<std::vector<char>> bufs(iters, std::vector<char>(sz, 'b'));
  std::vector<void*> reqs(iters);
  t0 = now_s();
  for (int i = 0; i < iters; i++)
    reqs[i] = g_rank == 0 ? send_nb(bufs[i].data(), sz, mktag(0, 24))
                          : recv_nb(bufs[i].data(), sz, mktag(0, 24), FULL_MASK);
  for (auto r : reqs)
    if (wait_req(r) != UCS_OK) {
      LOG("bw req failed\n");
      exit(4);
    }
  if (g_rank == 1)
    send_b(&ack, 8, 25);
  else
    recv_b(&ack, 8, 25);
  dt = now_s() - t0;
  if (g_rank == 0)
    LOG("BW 4MiB x%d (window=%d): %.1f MB/s\n", iters, iters, sz * (double)iters / dt / 1e6);
}

static void test_kill() {
  char b[64] = {};
  for (int i = 0; i < 10; i++) {
    if (g_rank == 0) {
      send_b(b, 64, 30);
      recv_b(b, 64, 31);
    } else {
      recv_b(b, 64, 30);
      send_b(b, 64, 31);
    }
  }
  bool big = getenv("KILL_BIG") && atoi(getenv("KILL_BIG"));
  const size_t BIG = 256 << 20;
  if (g_rank == 0) {  // victim: keep progressing until killed
    if (big) {
      static std::vector<char> bb(BIG, 'x');
      void* r = send_nb(bb.data(), BIG, mktag(0, 45));
      (void)r;
    }
    double t0 = now_s();
    while (now_s() - t0 < 60) ucp_worker_progress(g_w);
    LOG("victim was not killed?\n");
    exit(5);
  }
  auto pv = read_file_wait("pid.0");
  int pidA;
  memcpy(&pidA, pv.data(), sizeof pidA);
  char b1[64], b2[64];
  ucp_tag_recv_info_t i1{}, i2{};
  void* r_spec = recv_nb(b1, 64, mktag(0, 40), FULL_MASK);    // from A, exact tag
  void* r_any = recv_nb(b2, 64, mktag(0, 41), ANY_SRC_MASK);  // any source
  double t = now_s();
  while (now_s() - t < 0.2) ucp_worker_progress(g_w);
  void* r_big = nullptr;
  ucs_status_t s_big = UCS_OK;
  double t_big = 0;
  std::vector<char> bigbuf;
  if (big) {  // probe the 256 MiB rndv message (RTS arrived), start the receive, then kill A at
              // once
    ucp_tag_recv_info_t pi{};
    ucp_tag_message_h m;
    while (!(m = ucp_tag_probe_nb(g_w, mktag(0, 45), FULL_MASK, 1, &pi))) ucp_worker_progress(g_w);
    bigbuf.resize(pi.length);
    ucp_request_param_t p{};
    r_big = ucp_tag_msg_recv_nbx(g_w, bigbuf.data(), pi.length, m, &p);
    s_big = r_big ? UCS_INPROGRESS : UCS_OK;
    LOG("big msg (%zu B) matched via probe; msg_recv returned %s\n", pi.length,
        r_big ? "request" : "NULL (done)");
  }
  bool ksend = getenv("KILL_SEND") && atoi(getenv("KILL_SEND"));
  LOG("killing A (pid %d); KILL_SEND=%d\n", pidA, ksend);
  g_t_kill = now_s();
  kill(pidA, SIGKILL);
  ucs_status_t s_spec = UCS_INPROGRESS, s_any = UCS_INPROGRESS;
  double t_spec = 0, t_any = 0, last_send = 0;
  int nsend = 0;
  ucs_status_t last_send_st = UCS_OK;
  std::vector<void*> sreqs;
  const char* wm = getenv("WAIT");
  bool kpoll = wm && !strcmp(wm, "poll");
  int efd = -1, nwake = 0;
  if (kpoll) {
    CHECK(ucp_worker_get_efd(g_w, &efd));
    LOG("kill test waits with arm+poll (poll timeout = remaining of 30 s)\n");
  }
  while (now_s() - g_t_kill < 30) {
    while (ucp_worker_progress(g_w)) {
    }
    if (kpoll && !g_err_fired && ucp_worker_arm(g_w) == UCS_OK) {
      pollfd pfd{efd, POLLIN, 0};
      int ms = (int)((30 - (now_s() - g_t_kill)) * 1000);
      if (ms < 0) ms = 0;
      int pr = poll(&pfd, 1, ms);
      nwake++;
      LOG("poll returned %d after %.3f s since kill\n", pr, now_s() - g_t_kill);
      continue;
    }
    if (s_spec == UCS_INPROGRESS &&
        (s_spec = ucp_tag_recv_request_test(r_spec, &i1)) != UCS_INPROGRESS) {
      t_spec = now_s() - g_t_kill;
      LOG("recv(specific) completed: %s after %.3f s\n", ucs_status_string(s_spec), t_spec);
    }
    if (s_any == UCS_INPROGRESS &&
        (s_any = ucp_tag_recv_request_test(r_any, &i2)) != UCS_INPROGRESS) {
      t_any = now_s() - g_t_kill;
      LOG("recv(any-src) completed: %s after %.3f s\n", ucs_status_string(s_any), t_any);
    }
    if (s_big == UCS_INPROGRESS && (s_big = ucp_request_check_status(r_big)) != UCS_INPROGRESS) {
      t_big = now_s() - g_t_kill;
      LOG("recv(big, in-flight rndv) completed: %s after %.3f s\n", ucs_status_string(s_big),
          t_big);
    }
    if (ksend && !g_err_fired && now_s() - last_send > 0.1) {
      last_send = now_s();
      void* r = send_nb(b, 64, mktag(1, 50));
      nsend++;
      if (UCS_PTR_IS_ERR(r))
        last_send_st = UCS_PTR_STATUS(r);
      else if (r)
        sreqs.push_back(r);
    }
    if (g_err_fired && (s_spec != UCS_INPROGRESS || now_s() - g_err_time > 2)) break;
  }
  LOG("after loop: err_cb=%d (%s, %.3f s after kill); recv(specific)=%s; recv(any)=%s; sends=%d "
      "last_send_st=%s\n",
      g_err_fired, ucs_status_string(g_err_status), g_err_fired ? g_err_time - g_t_kill : -1.0,
      ucs_status_string(s_spec), ucs_status_string(s_any), nsend, ucs_status_string(last_send_st));
  int ndone = 0, nerr = 0;
  ucs_status_t first_err = UCS_OK;
  for (auto r : sreqs) {
    ucs_status_t s = ucp_request_check_status(r);
    if (s != UCS_INPROGRESS) {
      ndone++;
      if (s != UCS_OK) {
        nerr++;
        if (first_err == UCS_OK) first_err = s;
      }
      ucp_request_free(r);
    }
  }
  if (ksend)
    LOG("pending send reqs: %zu, completed %d (with error %d, first: %s)\n", sreqs.size(), ndone,
        nerr, ucs_status_string(first_err));
  if (r_big) {
    if (s_big == UCS_INPROGRESS)
      LOG("recv(big) still in progress\n");
    else
      ucp_request_free(r_big);
  }
  if (g_err_fired) {  // send on failed ep
    void* r = send_nb(b, 8, mktag(1, 51));
    LOG("send on failed ep returns: %s\n", r == nullptr ? "NULL(ok)"
                                           : UCS_PTR_IS_ERR(r)
                                               ? ucs_status_string(UCS_PTR_STATUS(r))
                                               : "request");
    if (r && !UCS_PTR_IS_ERR(r)) {
      ucs_status_t s = wait_req(r, 2);
      LOG("  -> request status %s\n", ucs_status_string(s));
    }
  }
  for (void* r : {r_spec, r_any}) {
    if (ucp_request_check_status(r) == UCS_INPROGRESS) {
      ucp_request_cancel(g_w, r);
      ucp_worker_progress(g_w);
      LOG("cancelled pending recv -> status %s\n", ucs_status_string(ucp_request_check_status(r)));
    }
    ucp_request_free(r);
  }
  if (!g_err_fired) {
    LOG("no error detected within 30 s\n");
    _exit(0);
  }
}

static void test_probe() {
  const size_t sizes[] = {1000, 8000, 100000, 1 << 20, 10 << 20};
  for (size_t sz : sizes) {
    if (g_rank == 0) {
      std::vector<char> v(sz);
      for (size_t i = 0; i < sz; i++) v[i] = (char)(i * 7 + sz);
      send_b(v.data(), sz, 60);
    } else {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = nullptr;
      double t0 = now_s();
      while (!(msg = ucp_tag_probe_nb(g_w, mktag(0, 60), ANY_SRC_MASK, 1, &info))) {
        ucp_worker_progress(g_w);
        if (now_s() - t0 > 30) {
          LOG("probe timeout for %zu\n", sz);
          exit(4);
        }
      }
      std::vector<char> v(info.length);
      ucp_request_param_t p{};
      void* r = ucp_tag_msg_recv_nbx(g_w, v.data(), v.size(), msg, &p);
      ucp_tag_recv_info_t ri{};
      ucs_status_t st = wait_req(r, 30, &ri);
      bool ok = st == UCS_OK && info.length == sz;
      for (size_t i = 0; ok && i < sz; i++) ok = v[i] == (char)(i * 7 + sz);
      LOG("PROBE size=%zu probed len=%zu sender_tag=%#lx msg_recv=%s data %s\n", sz, info.length,
          (unsigned long)info.sender_tag, ucs_status_string(st), ok ? "OK" : "BAD");
    }
    uint64_t x = 0;
    if (g_rank == 1)
      send_b(&x, 8, 61);
    else
      recv_b(&x, 8, 61);
  }
}

static void test_efd() {
  const char* wm = getenv("WAIT");
  bool use_poll = !(wm && !strcmp(wm, "busy"));
  int efd = -1;
  if (g_rank == 1 && use_poll) CHECK(ucp_worker_get_efd(g_w, &efd));
  for (size_t sz : {(size_t)8, (size_t)(1 << 20)}) {
    std::vector<char> buf(std::max(sz, (size_t)16));
    if (g_rank == 0) {
      double t = now_s();
      while (now_s() - t < 3) ucp_worker_progress(g_w);
      double ts = now_s();
      memcpy(buf.data(), &ts, 8);
      send_b(buf.data(), sz, 70);
    } else {
      void* r = recv_nb(buf.data(), sz, mktag(0, 70), FULL_MASK);
      double c0 = cpu_s(), t0 = now_s();
      int wakes = 0, busy = 0, tmo = 0;
      long progs = 0;
      ucs_status_t st;
      for (;;) {
        while (ucp_worker_progress(g_w)) progs++;
        progs++;
        if ((st = ucp_request_check_status(r)) != UCS_INPROGRESS) break;
        if (now_s() - t0 > 30) {
          LOG("efd wait timeout\n");
          exit(4);
        }
        if (!use_poll) continue;
        ucs_status_t a = ucp_worker_arm(g_w);
        if (a == UCS_ERR_BUSY) {
          busy++;
          continue;
        }
        CHECK(a);
        pollfd pfd{efd, POLLIN, 0};
        if (poll(&pfd, 1, 1000) == 0)
          tmo++;
        else
          wakes++;
      }
      double t1 = now_s(), c1 = cpu_s(), ts;
      memcpy(&ts, buf.data(), 8);
      ucp_request_free(r);
      LOG("EFD %s size=%zu status=%s waited %.3f s, CPU %.3f s (%.0f%%), wake latency %.1f us, "
          "poll: fd-ready=%d timeouts(1s)=%d arm_busy=%d progress calls=%ld\n",
          use_poll ? "arm+poll" : "busy-poll", sz, ucs_status_string(st), t1 - t0, c1 - c0,
          (c1 - c0) / (t1 - t0) * 100, (t1 - ts) * 1e6, wakes, tmo, busy, progs);
    }
    uint64_t x = 0;
    if (g_rank == 1)
      send_b(&x, 8, 71);
    else
      recv_b(&x, 8, 71);
  }
}

int main(int argc, char** argv) {
  if (argc >= 3 && !strcmp(argv[1], "launch")) {
    char tmpl[] = "/tmp/ucxprobe/run.XXXXXX";
    if (!mkdtemp(tmpl)) {
      perror("mkdtemp");
      return 1;
    }
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
      if ((pids[r] = fork()) == 0) {
        std::string rs = std::to_string(r);
        execl("/proc/self/exe", argv[0], "run", rs.c_str(), tmpl, argv[2], (char*)nullptr);
        _exit(127);
      }
    }
    double t0 = now_s();
    int left = 2, rc = 0;
    while (left > 0) {
      int status;
      pid_t p = waitpid(-1, &status, WNOHANG);
      if (p > 0) {
        left--;
        if (WIFSIGNALED(status))
          printf("[launcher] pid %d killed by signal %d\n", p, WTERMSIG(status));
        else if (WEXITSTATUS(status)) {
          printf("[launcher] pid %d exit %d\n", p, WEXITSTATUS(status));
          rc = 1;
        }
        continue;
      }
      if (now_s() - t0 > 90) {
        printf("[launcher] timeout, killing\n");
        kill(pids[0], 9);
        kill(pids[1], 9);
      }
      usleep(10000);
    }
    std::string cmd = std::string("rm -rf ") + tmpl;
    system(cmd.c_str());
    return rc;
  }
  if (argc < 5 || strcmp(argv[1], "run")) {
    fprintf(stderr, "usage: %s launch <test>\n", argv[0]);
    return 1;
  }
  setvbuf(stdout, nullptr, _IONBF, 0);
  g_rank = atoi(argv[2]);
  g_dir = argv[3];
  std::string test = argv[4];
  const char* pe = getenv("PEER");
  g_peer_err = !(pe && !strcmp(pe, "0"));
  setup(test == "efd" || (getenv("WAIT") && !strcmp(getenv("WAIT"), "poll")));
  if (test == "info" || getenv("EPINFO")) print_ep();
  if (test == "lat")
    test_lat();
  else if (test == "bw")
    test_bw();
  else if (test == "kill")
    test_kill();
  else if (test == "probe")
    test_probe();
  else if (test == "efd")
    test_efd();
  teardown();
  return 0;
}
