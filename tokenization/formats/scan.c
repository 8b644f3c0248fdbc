/* One pass over a block of tokens: the sums of each piece's contents hash, the largest id and loss byte (the id-range
 * and loss-byte checks) and the token before each index entry (the EOS check); the reads of a block's windows, and
 * the copies that put a block's units in their places.
 * Loaded with ctypes by tokenization/formats/native.py; the numpy path of tokenization/formats/contents.py is the
 * reference these values must equal bit for bit (tests/formats/test_native.py).
 *
 * tk_scan(tokens, token_size, loss, n, cuts, ncuts, sums, weighted, before, tops)
 *   tokens: n unsigned little-endian ids of token_size (2 or 4) bytes; loss: n bytes, or NULL (read as all 0).
 *   cuts: ncuts sorted offsets in [0, n], which cut [0, n) into ncuts + 1 segments: [0, cuts[0]), [cuts[0],
 *   cuts[1]), ..., [cuts[ncuts - 1], n). With y = (2 * id + ((loss + 1) mod 256)) ** 2 mod 2 ** 64 for each token,
 *   segment k gets sums[k] = the sum of y and weighted[k] = the sum of (i - its start) * y over its tokens i, both
 *   mod 2 ** 64 (an empty segment: 0, 0). before[k] = the id at cuts[k] - 1 for each cut above 0 (a cut at 0: left
 *   as it is). tops[0] = the largest id, tops[1] = the largest loss byte (0 for none).
 *   n < 2 ** 32. Returns 0; -1 for a token size other than 2 or 4; -2 for cuts out of order or out of [0, n]
 *   (nothing is read past them).
 *
 * tk_pread(fds, offsets, lengths, to, count, out)
 *   Reads lengths[k] bytes at offsets[k] of descriptor fds[k] into out + to[k], for k in [0, count), retrying
 *   short reads: a block's units straight into their places in its buffer (places never overlap, which the
 *   caller's offsets ensure). Consecutive units that lie end to end in one file are read by one preadv into their
 *   places (up to IOV_BATCH of them): a merge's block reads each source's run of documents in a call or a few,
 *   with no copy but the kernel's. Returns the bytes read in all: less than the sum of lengths when a file ended
 *   early (the units after it unread); -errno on an error.
 *
 * tk_copy(src, src_size, from, lengths, count, dst, dst_size, to)
 *   Copies lengths[k] bytes from src + from[k] to dst + to[k], for k in [0, count): a block's units gathered from
 *   what was read of one source into their places in the block's output (units may repeat; places never overlap,
 *   which the caller's offsets ensure). Returns 0; -2, before copying unit k, when unit k lies outside src_size
 *   or dst_size bytes.
 *
 * No allocation, no global state: both are safe on any thread, and ctypes releases the GIL around them. Built with
 * GCC's function multi-versioning: one build runs the AVX-512, the AVX2 or the generic clone, whichever the CPU has.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* Lanes: token j of a segment goes to lane j mod W, whose sums the loop keeps apart so that it vectorizes. */
enum { W = 16 };

/* Places a preadv of tk_pread fills at most (Linux's IOV_MAX). */
enum { IOV_BATCH = 1024 };

/* y for an id t (below 2 ** 32) and a loss byte l, as 32x32->64-bit products only, which every vector unit has:
 * (2t + c) ** 2 = 4 t t + 4 t c + c c, with c = (l + 1) mod 256. */
static inline uint64_t weight(uint32_t t, uint8_t l) {
    uint32_t c = (uint8_t)(l + 1);
    return (((uint64_t)t * t) << 2) + (((uint64_t)t * c) << 2) + (uint64_t)c * c;
}

/* One segment [start, stop) into sums[k], weighted[k], id_top and loss_top. Lane l holds tokens j = m W + l for
 * m < M = len / W: A[l] = the sum of its y, B[l] = the sum over m of the y before m, so that the sum of m y is
 * (M - 1) A[l] - B[l], and the sum of j y is W times that plus l A[l]: no multiplication by the position in the
 * loop. The last len mod W tokens go one by one. */
#define SEGMENT(T, LOSS)                                                                                    \
    {                                                                                                       \
        const T *t = (const T *)tokens + start;                                                             \
        const uint8_t *L = loss ? loss + start : 0;                                                         \
        (void)L;                                                                                            \
        uint32_t len = (uint32_t)(stop - start), M = len / W;                                               \
        uint64_t A[W] = {0}, B[W] = {0};                                                                    \
        uint32_t top[W] = {0};                                                                              \
        uint8_t ltop[W] = {0};                                                                              \
        for (uint32_t m = 0; m < M; m++) {                                                                  \
            for (int l = 0; l < W; l++) {                                                                   \
                uint32_t x = t[m * W + l];                                                                  \
                uint8_t lb = LOSS(m * W + l);                                                               \
                uint64_t y = weight(x, lb);                                                                 \
                B[l] += A[l];                                                                               \
                A[l] += y;                                                                                  \
                top[l] = top[l] > x ? top[l] : x;                                                           \
                ltop[l] = ltop[l] > lb ? ltop[l] : lb;                                                      \
            }                                                                                               \
        }                                                                                                   \
        uint64_t a = 0, b = 0;                                                                              \
        for (int l = 0; l < W; l++) {                                                                       \
            a += A[l];                                                                                      \
            b += (uint64_t)W * ((uint64_t)(M - 1) * A[l] - B[l]) + (uint64_t)l * A[l];                      \
            id_top = id_top > top[l] ? id_top : top[l];                                                     \
            loss_top = loss_top > ltop[l] ? loss_top : ltop[l];                                             \
        }                                                                                                   \
        for (uint32_t j = M * W; j < len; j++) {                                                            \
            uint32_t x = t[j];                                                                              \
            uint8_t lb = LOSS(j);                                                                           \
            uint64_t y = weight(x, lb);                                                                     \
            a += y;                                                                                         \
            b += (uint64_t)j * y;                                                                           \
            id_top = id_top > x ? id_top : x;                                                               \
            loss_top = loss_top > lb ? loss_top : lb;                                                       \
        }                                                                                                   \
        sums[k] = a;                                                                                        \
        weighted[k] = b;                                                                                    \
        if (k < ncuts && stop > 0) before[k] = ((const T *)tokens)[stop - 1];                              \
    }
#define WITH_LOSS(i) L[i]
#define NO_LOSS(i) 0

CLONES int tk_scan(const void *tokens, int token_size, const uint8_t *loss, int64_t n, const int64_t *cuts,
                   int64_t ncuts, uint64_t *sums, uint64_t *weighted, uint64_t *before, uint64_t *tops) {
    if (token_size != 2 && token_size != 4) return -1;
    uint32_t id_top = 0;
    uint8_t loss_top = 0;
    for (int64_t k = 0; k <= ncuts; k++) {
        int64_t start = k ? cuts[k - 1] : 0, stop = k < ncuts ? cuts[k] : n;
        if (start < 0 || stop < start || stop > n) return -2;
        if (token_size == 2) {
            if (loss) SEGMENT(uint16_t, WITH_LOSS) else SEGMENT(uint16_t, NO_LOSS)
        } else {
            if (loss) SEGMENT(uint32_t, WITH_LOSS) else SEGMENT(uint32_t, NO_LOSS)
        }
    }
    tops[0] = id_top;
    tops[1] = loss_top;
    return 0;
}

int64_t tk_pread(const int *fds, const int64_t *offsets, const int64_t *lengths, const int64_t *to, int64_t count,
                 uint8_t *out) {
    struct iovec iov[IOV_BATCH];
    int64_t total = 0;
    for (int64_t k = 0; k < count;) {
        int fd = fds[k];
        int64_t at = offsets[k], want = 0;
        int n = 0;
        do { /* the run of units from k that lie end to end in fd */
            iov[n].iov_base = out + to[k];
            iov[n].iov_len = (size_t)lengths[k];
            want += lengths[k];
            n++;
            k++;
        } while (k < count && n < IOV_BATCH && fds[k] == fd && offsets[k] == at + want);
        struct iovec *v = iov;
        for (int64_t done = 0; done < want;) {
            ssize_t got = preadv(fd, v, n, at + done);
            if (got < 0) {
                if (errno == EINTR) continue;
                return -errno;
            }
            if (got == 0) return total;
            done += got;
            total += got;
            for (; n && (size_t)got >= v->iov_len; n--) got -= (ssize_t)(v++)->iov_len; /* the places filled */
            if (n) {
                v->iov_base = (uint8_t *)v->iov_base + got;
                v->iov_len -= (size_t)got;
            }
        }
    }
    return total;
}

int tk_copy(const uint8_t *src, int64_t src_size, const int64_t *from, const int64_t *lengths, int64_t count,
            uint8_t *dst, int64_t dst_size, const int64_t *to) {
    for (int64_t k = 0; k < count; k++) {
        int64_t n = lengths[k];
        if (n < 0 || from[k] < 0 || to[k] < 0 || from[k] > src_size - n || to[k] > dst_size - n) return -2;
        memcpy(dst + to[k], src + from[k], (size_t)n);
    }
    return 0;
}
