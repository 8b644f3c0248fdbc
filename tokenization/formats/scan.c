/* One pass over a block of tokens: the sums of each piece's contents hash, the id-range and loss-byte checks and the
 * token before each index entry (the EOS check), and the reads of a block's windows; loaded with ctypes by
 * tokenization/formats/native.py, whose numpy path is the reference these functions must equal bit for bit.
 *
 * tk_scan(tokens, token_size, loss, n, cuts, ncuts, limit, sums, weighted, before, over)
 *   tokens: n unsigned little-endian ids of token_size (2 or 4) bytes; loss: n bytes, or NULL (read as all 0).
 *   cuts: ncuts sorted offsets in [0, n], which cut [0, n) into ncuts + 1 segments: [0, cuts[0]), [cuts[0],
 *   cuts[1]), ..., [cuts[ncuts - 1], n). With y = (2 * id + ((loss + 1) mod 256)) ** 2 mod 2 ** 64 for each token,
 *   segment k gets sums[k] = sum of y and weighted[k] = sum of (i - its start) * y over its tokens i, mod 2 ** 64
 *   (an empty segment: 0, 0). before[k] = the id at cuts[k] - 1 for each cut above 0 (a cut at 0: left as it is).
 *   over[0] = the number of ids >= limit (none counted when limit < 0); over[1] = the number of loss bytes above 1.
 *   n < 2 ** 32. Returns 0; -1 for a token size other than 2 or 4; -2 for cuts out of order or out of [0, n]
 *   (nothing read past them).
 *
 * tk_pread(fds, offsets, lengths, count, out)
 *   Reads lengths[k] bytes at offsets[k] of descriptor fds[k] into out, end to end, for k in [0, count), retrying
 *   short reads. Returns the bytes read in all: less than the sum of lengths when a file ended early; -errno on an
 *   error.
 *
 * No allocation, no global state: both are safe on any thread, and the caller releases the GIL around them.
 * Built with GCC's function multi-versioning: one build runs the AVX-512, the AVX2 or the generic clone, whichever
 * the CPU has.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <unistd.h>

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* y for an id t (below 2 ** 32) and a loss byte l, as 32x32->64-bit products only, which every vector unit has:
 * (2t + c) ** 2 = 4 t t + 4 t c + c c, with c = (l + 1) mod 256. */
static inline uint64_t weight(uint32_t t, uint8_t l) {
    uint32_t c = (uint8_t)(l + 1);
    return (((uint64_t)t * t) << 2) + (((uint64_t)t * c) << 2) + (uint64_t)c * c;
}

/* j * y mod 2 ** 64 for j below 2 ** 32, from the two halves of y. */
static inline uint64_t times(uint32_t j, uint64_t y) {
    return (uint64_t)j * (uint32_t)y + (((uint64_t)j * (uint32_t)(y >> 32)) << 32);
}

#define SEGMENTS(T, LOSS, CHECK)                                                            \
    for (int64_t k = 0; k <= ncuts; k++) {                                                  \
        int64_t start = k ? cuts[k - 1] : 0, stop = k < ncuts ? cuts[k] : n;                \
        if (start < 0 || stop < start || stop > n) return -2;                               \
        uint64_t a = 0, b = 0, bad = 0, bad_loss = 0;                                       \
        const T *t = (const T *)tokens + start;                                             \
        uint32_t len = (uint32_t)(stop - start);                                            \
        for (uint32_t j = 0; j < len; j++) {                                                \
            uint8_t l = LOSS;                                                               \
            uint64_t y = weight(t[j], l);                                                   \
            a += y;                                                                         \
            b += times(j, y);                                                               \
            bad += CHECK;                                                                   \
            bad_loss += l > 1;                                                              \
        }                                                                                   \
        sums[k] = a;                                                                        \
        weighted[k] = b;                                                                    \
        over[0] += bad;                                                                     \
        over[1] += bad_loss;                                                                \
        if (k < ncuts && stop > 0) before[k] = ((const T *)tokens)[stop - 1];               \
    }

/* The four loops of one token type: with or without loss bytes, with or without the id check. */
#define VARIANTS(T)                                                                         \
    if (loss && check) {                                                                    \
        SEGMENTS(T, loss[start + j], t[j] >= lim)                                           \
    } else if (loss) {                                                                      \
        SEGMENTS(T, loss[start + j], 0)                                                     \
    } else if (check) {                                                                     \
        SEGMENTS(T, 0, t[j] >= lim)                                                         \
    } else {                                                                                \
        SEGMENTS(T, 0, 0)                                                                   \
    }

CLONES int tk_scan(const void *tokens, int token_size, const uint8_t *loss, int64_t n, const int64_t *cuts,
                   int64_t ncuts, int64_t limit, uint64_t *sums, uint64_t *weighted, uint64_t *before,
                   uint64_t *over) {
    over[0] = over[1] = 0;
    uint64_t top = token_size == 2 ? UINT16_MAX : UINT32_MAX;
    int check = limit >= 0 && (uint64_t)limit <= top; /* a limit above every id of the type finds none */
    uint32_t lim = check ? (uint32_t)limit : 0;
    if (token_size == 2) {
        VARIANTS(uint16_t)
    } else if (token_size == 4) {
        VARIANTS(uint32_t)
    } else {
        return -1;
    }
    return 0;
}

int64_t tk_pread(const int *fds, const int64_t *offsets, const int64_t *lengths, int64_t count, uint8_t *out) {
    int64_t total = 0;
    for (int64_t k = 0; k < count; k++) {
        int64_t done = 0;
        while (done < lengths[k]) {
            ssize_t got = pread(fds[k], out + total, (size_t)(lengths[k] - done), offsets[k] + done);
            if (got < 0) {
                if (errno == EINTR) continue;
                return -errno;
            }
            if (got == 0) return total;
            done += got;
            total += got;
        }
    }
    return total;
}
