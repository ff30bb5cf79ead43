/* The delta codec's per-element loops in C (native.py loads this; NumPy versions are the
 * reference and the fallback). Each function here produces exactly the bits of its NumPy
 * counterpart, named beside it (plan: the same choice but on a near-tie of its floating-point
 * costs); tests/weights/test_native.py compares the two.
 *
 * Arrays arrive as contiguous buffers (numpy arrays); element widths are passed explicitly.
 * Every loop runs with the GIL released, so the codec's threads code pieces in parallel.
 * Functions that produce a variable number of results take output buffers with a capacity
 * and return (count, where they stopped); the caller continues from there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t u64;

/* The two scans over whole tensors get AVX2 code where the CPU has it, picked at load time
 * (GCC's function multiversioning); elsewhere the compiler's baseline. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

static inline u64 load(const uint8_t *p, int w) {
    switch (w) {
    case 1: return p[0];
    case 2: { uint16_t x; memcpy(&x, p, 2); return x; }
    case 4: { uint32_t x; memcpy(&x, p, 4); return x; }
    default: { u64 x; memcpy(&x, p, 8); return x; }
    }
}

static inline void store(uint8_t *p, int w, u64 v) {
    switch (w) {
    case 1: p[0] = (uint8_t)v; break;
    case 2: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
    case 4: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    default: memcpy(p, &v, 8);
    }
}

static int check_width(int w) {
    if (w == 1 || w == 2 || w == 4 || w == 8) return 0;
    PyErr_Format(PyExc_ValueError, "element width %d is not 1, 2, 4 or 8", w);
    return -1;
}

static int need(Py_buffer *b, Py_ssize_t bytes, const char *what) {
    if (b->len >= bytes) return 0;
    PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, needs %zd", what, b->len, bytes);
    return -1;
}

#define RELEASE(...) do { Py_buffer *bs_[] = {__VA_ARGS__}; \
    for (size_t i_ = 0; i_ < sizeof bs_ / sizeof *bs_; i_++) PyBuffer_Release(bs_[i_]); } while (0)

/* The loop of `changes` below: from i, until n or the outputs are full; -> where it stopped. */
static CLONES Py_ssize_t changes_kernel(int w, const uint8_t *pa, const uint8_t *pb,
                                        Py_ssize_t n, Py_ssize_t i, Py_ssize_t cap,
                                        int64_t *pos, uint8_t *oa, uint8_t *ob,
                                        Py_ssize_t *count_out) {
    Py_ssize_t count = 0;
    /* 32 elements at a time: a bit mask of the changed ones (vector compares), then each set
     * bit; the last few one by one */
#define CHANGES_LOOP(T) { const T *x = (const T *)pa, *y = (const T *)pb; \
        T *xo = (T *)oa, *yo = (T *)ob; \
        for (; i + 32 <= n && count + 32 <= cap; i += 32) { \
            uint32_t mask = 0; \
            for (int j = 0; j < 32; j++) mask |= (uint32_t)(x[i + j] != y[i + j]) << j; \
            while (mask) { \
                Py_ssize_t k = i + __builtin_ctz(mask); \
                pos[count] = k; xo[count] = x[k]; yo[count] = y[k]; count++; \
                mask &= mask - 1; \
            } } \
        for (; i < n && count < cap; i++) \
            if (x[i] != y[i]) { pos[count] = i; xo[count] = x[i]; yo[count] = y[i]; count++; } }
    switch (w) {  /* numpy buffers are aligned to their element */
    case 1: CHANGES_LOOP(uint8_t) break;
    case 2: CHANGES_LOOP(uint16_t) break;
    case 4: CHANGES_LOOP(uint32_t) break;
    default: CHANGES_LOOP(u64)
    }
    *count_out = count;
    return i;
}

/* changes(w, a, b, start, pos_out, a_out, b_out) -> (count, next): the positions i >= start
 * where a[i] != b[i], and a and b there, until the outputs are full (extract.changes). */
static PyObject *changes(PyObject *self, PyObject *args) {
    int w;
    Py_ssize_t start;
    Py_buffer a, b, po, ao, bo;
    if (!PyArg_ParseTuple(args, "iy*y*nw*w*w*", &w, &a, &b, &start, &po, &ao, &bo)) return NULL;
    Py_ssize_t n = a.len / (w > 0 ? w : 1), cap = po.len / 8, count = 0, i = start;
    if (check_width(w) || need(&b, a.len, "b") || need(&ao, cap * w, "a_out")
        || need(&bo, cap * w, "b_out") || start < 0 || start > n) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "start out of range");
        RELEASE(&a, &b, &po, &ao, &bo);
        return NULL;
    }
    const uint8_t *pa = a.buf, *pb = b.buf;
    int64_t *pos = po.buf;
    uint8_t *oa = ao.buf, *ob = bo.buf;
    Py_BEGIN_ALLOW_THREADS
    i = changes_kernel(w, pa, pb, n, i, cap, pos, oa, ob, &count);
    Py_END_ALLOW_THREADS
    RELEASE(&a, &b, &po, &ao, &bo);
    return Py_BuildValue("nn", count, i);
}

/* fp32 bits -> bf16 bits, rounded to nearest even, as torch casts a finite value (NaN is not
 * handled here: bf16_changes refuses it). */
static inline uint16_t bf16_rne(uint32_t u) {
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* The loop of `bf16_changes` below; -> where it stopped, or -1 at a NaN. */
static CLONES Py_ssize_t bf16_kernel(const uint32_t *x, const uint32_t *y, Py_ssize_t n,
                                     Py_ssize_t i, Py_ssize_t cap, int64_t *pos, uint16_t *xo,
                                     uint16_t *yo, Py_ssize_t *count_out) {
    Py_ssize_t count = 0;
    /* 32 at a time: the largest magnitude bits (a NaN is above infinity's) and a flag per
     * element whose casts differ, both in loops the compiler vectorizes; then each flag */
    for (; i + 32 <= n && count + 32 <= cap; i += 32) {
        uint32_t big = 0, any = 0;
        uint8_t diff[32];
        for (int j = 0; j < 32; j++) {
            uint32_t a = x[i + j], b = y[i + j];
            uint32_t ma = a & 0x7FFFFFFFu, mb = b & 0x7FFFFFFFu;
            big = big > ma ? big : ma;
            big = big > mb ? big : mb;
            diff[j] = (uint8_t)(bf16_rne(a) != bf16_rne(b));
            any |= diff[j];
        }
        if (big > 0x7F800000u) { *count_out = count; return -1; }
        if (!any) continue;
        uint32_t mask = 0;
        for (int j = 0; j < 32; j++) mask |= (uint32_t)diff[j] << j;
        while (mask) {
            Py_ssize_t k = i + __builtin_ctz(mask);
            pos[count] = k; xo[count] = bf16_rne(x[k]); yo[count] = bf16_rne(y[k]); count++;
            mask &= mask - 1;
        }
    }
    for (; i < n && count < cap; i++) {
        uint32_t a = x[i], b = y[i];
        if ((a & 0x7FFFFFFFu) > 0x7F800000u || (b & 0x7FFFFFFFu) > 0x7F800000u) {
            *count_out = count;
            return -1;
        }
        if (bf16_rne(a) != bf16_rne(b)) {
            pos[count] = i; xo[count] = bf16_rne(a); yo[count] = bf16_rne(b); count++;
        }
    }
    *count_out = count;
    return i;
}

/* bf16_changes(a, b, start, pos_out, a_out, b_out) -> (count, next): a and b fp32 buffers; the
 * positions i >= start where their bf16 casts differ, and both casts there (uint16), until
 * the outputs are full; next is -1 where a value is NaN (trainer/step_changes.py). */
static PyObject *bf16_changes(PyObject *self, PyObject *args) {
    Py_ssize_t start;
    Py_buffer a, b, po, ao, bo;
    if (!PyArg_ParseTuple(args, "y*y*nw*w*w*", &a, &b, &start, &po, &ao, &bo)) return NULL;
    Py_ssize_t n = a.len / 4, cap = po.len / 8, count = 0, i = start;
    if (need(&b, a.len, "b") || need(&ao, cap * 2, "a_out") || need(&bo, cap * 2, "b_out")
        || start < 0 || start > n) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "start out of range");
        RELEASE(&a, &b, &po, &ao, &bo);
        return NULL;
    }
    const uint32_t *x = a.buf, *y = b.buf;
    int64_t *pos = po.buf;
    uint16_t *xo = ao.buf, *yo = bo.buf;
    Py_BEGIN_ALLOW_THREADS
    i = bf16_kernel(x, y, n, i, cap, pos, xo, yo, &count);
    Py_END_ALLOW_THREADS
    RELEASE(&a, &b, &po, &ao, &bo);
    return Py_BuildValue("nn", count, i);
}

/* The loop of `small` below: from i, until n or the output is full; -> where it stopped. */
static CLONES Py_ssize_t small_kernel(int w, const uint8_t *pa, u64 mag, u64 bound, Py_ssize_t n,
                                      Py_ssize_t i, Py_ssize_t cap, int64_t *pos,
                                      Py_ssize_t *count_out) {
    Py_ssize_t count = 0;
#define SMALL_LOOP(T) { const T *x = (const T *)pa; T m = (T)mag, bd = (T)bound; \
        for (; i + 32 <= n && count + 32 <= cap; i += 32) { \
            uint32_t mask = 0; \
            for (int j = 0; j < 32; j++) mask |= (uint32_t)((T)(x[i + j] & m) < bd) << j; \
            while (mask) { \
                pos[count++] = i + __builtin_ctz(mask); \
                mask &= mask - 1; \
            } } \
        for (; i < n && count < cap; i++) { pos[count] = i; count += (T)(x[i] & m) < bd; } }
    switch (w) {  /* numpy buffers are aligned to their element */
    case 1: SMALL_LOOP(uint8_t) break;
    case 2: SMALL_LOOP(uint16_t) break;
    case 4: SMALL_LOOP(uint32_t) break;
    default: SMALL_LOOP(u64)
    }
    *count_out = count;
    return i;
}

/* small(w, a, mag, bound, start, pos_out) -> (count, next): positions i >= start with
 * (a[i] & mag) < bound (tiered.small_positions). */
static PyObject *small(PyObject *self, PyObject *args) {
    int w;
    unsigned long long mag, bound;
    Py_ssize_t start;
    Py_buffer a, po;
    if (!PyArg_ParseTuple(args, "iy*KKnw*", &w, &a, &mag, &bound, &start, &po)) return NULL;
    Py_ssize_t n = a.len / (w > 0 ? w : 1), cap = po.len / 8, count = 0, i = start;
    if (check_width(w) || start < 0 || start > n) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "start out of range");
        RELEASE(&a, &po);
        return NULL;
    }
    const uint8_t *pa = a.buf;
    int64_t *pos = po.buf;
    Py_BEGIN_ALLOW_THREADS
    i = small_kernel(w, pa, mag, bound, n, i, cap, pos, &count);
    Py_END_ALLOW_THREADS
    RELEASE(&a, &po);
    return Py_BuildValue("nn", count, i);
}

/* The additive hash's element hash (lthash.py): splitmix64's finaliser, two lanes. */
static inline u64 mix(u64 z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* The hash's movement from m changes (positions q, old and new bits widened), added to
 * s[0], s[1]: per lane, the sum of h(q, new) - h(q, old), where h packs (q, value) into one
 * word (or mixes q first: `packed` 0) and runs two keyed splitmix rounds (lthash.py). No
 * branch in the loops, so that the compiler vectorises them (AVX-512's 64-bit multiplies). */
static CLONES void hash_moves(const u64 *k, int packed, const u64 *q, const u64 *olds,
                              const u64 *news, Py_ssize_t m, u64 *s) {
    u64 s0 = 0, s1 = 0;
    if (packed) {
        for (Py_ssize_t j = 0; j < m; j++) {
            u64 xo = (q[j] << 32) | olds[j], xn = (q[j] << 32) | news[j];
            s0 += mix(mix(xn ^ k[0]) + k[1]) - mix(mix(xo ^ k[0]) + k[1]);
            s1 += mix(mix(xn ^ k[3]) + k[4]) - mix(mix(xo ^ k[3]) + k[4]);
        }
    } else {
        for (Py_ssize_t j = 0; j < m; j++) {
            u64 base = mix(q[j] + k[2]), xo = base ^ olds[j], xn = base ^ news[j];
            s0 += mix(mix(xn ^ k[0]) + k[1]) - mix(mix(xo ^ k[0]) + k[1]);
            s1 += mix(mix(xn ^ k[3]) + k[4]) - mix(mix(xo ^ k[3]) + k[4]);
        }
    }
    s[0] += s0;
    s[1] += s1;
}

/* change_sum(keys, w, packed, pos, old, new) -> (lane0, lane1): the sum over i of
 * h(pos[i], new[i]) - h(pos[i], old[i]) (lthash.change_sum; keys: tensor_keys' 6 words). */
static PyObject *change_sum(PyObject *self, PyObject *args) {
    int w, packed;
    Py_buffer kb, pb, ob, nb;
    if (!PyArg_ParseTuple(args, "y*iiy*y*y*", &kb, &w, &packed, &pb, &ob, &nb)) return NULL;
    Py_ssize_t n = pb.len / 8;
    if (check_width(w) || need(&kb, 48, "keys") || need(&ob, n * w, "old")
        || need(&nb, n * w, "new")) {
        RELEASE(&kb, &pb, &ob, &nb);
        return NULL;
    }
    u64 k[6], s[2] = {0, 0}, q[256], olds[256], news[256];
    memcpy(k, kb.buf, 48);
    const int64_t *pos = pb.buf;
    const uint8_t *po = ob.buf, *pn = nb.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i0 = 0; i0 < n; i0 += 256) {
        int m = n - i0 < 256 ? (int)(n - i0) : 256;
        for (int j = 0; j < m; j++) {
            q[j] = (u64)pos[i0 + j];
            olds[j] = load(po + (i0 + j) * w, w);
            news[j] = load(pn + (i0 + j) * w, w);
        }
        hash_moves(k, packed, q, olds, news, m, s);
    }
    Py_END_ALLOW_THREADS
    RELEASE(&kb, &pb, &ob, &nb);
    return Py_BuildValue("KK", (unsigned long long)s[0], (unsigned long long)s[1]);
}

/* Order-preserving keys of float bit patterns (entropy.float_key / float_unkey), width w. */
static inline u64 float_key(u64 x, int w) {
    u64 top = 1ULL << (8 * w - 1), ones = w == 8 ? ~0ULL : (1ULL << (8 * w)) - 1;
    return x ^ ((x & top) ? ones : top);
}

static inline u64 float_unkey(u64 k, int w) {
    u64 top = 1ULL << (8 * w - 1), ones = w == 8 ? ~0ULL : (1ULL << (8 * w)) - 1;
    return k ^ ((k & top) ? top : ones);
}

/* apply_keys(w, is_float, a, pos, kd, keys, packed, offset) -> (lane0, lane1): a[pos[i]] moves by
 * kd[i] in key space (wrapping at w bytes; floats through float_key, integers as they are),
 * the decode's last step for "sparse" and "tiered" entries, and the additive hash's movement
 * of those writes at positions pos + offset (a is a piece of a tensor from offset on), as
 * lthash.change_sum would give it (0, 0 when keys is empty). One pass
 * instead of a gather, two key maps, a scatter and the hash's gathers. Raises ValueError on
 * a position outside a, before writing anything. */
static PyObject *apply_keys(PyObject *self, PyObject *args) {
    int w, is_float, packed;
    Py_ssize_t offset;
    Py_buffer ab, pb, kb, keyb;
    if (!PyArg_ParseTuple(args, "iiw*y*y*y*in", &w, &is_float, &ab, &pb, &kb, &keyb, &packed,
                          &offset))
        return NULL;
    Py_ssize_t n = pb.len / 8, size = ab.len / (w > 0 ? w : 1);
    int hash = keyb.len > 0;
    if (check_width(w) || need(&kb, n * w, "kd") || (hash && need(&keyb, 48, "keys"))) {
        RELEASE(&ab, &pb, &kb, &keyb);
        return NULL;
    }
    const int64_t *pos = pb.buf;
    const uint8_t *pk = kb.buf;
    uint8_t *pa = ab.buf;
    u64 k[6] = {0}, s[2] = {0, 0}, mask = w == 8 ? ~0ULL : (1ULL << (8 * w)) - 1;
    if (hash) memcpy(k, keyb.buf, 48);
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) bad |= pos[i] < 0 || pos[i] >= size;
    /* blocks of 256: the scattered reads and writes in tight loops (many misses in flight),
     * then the hash over the block's values in cache */
    u64 q[256], olds[256], news[256];
    for (Py_ssize_t i0 = 0; i0 < n && !bad; i0 += 256) {
        int m = n - i0 < 256 ? (int)(n - i0) : 256;
        for (int j = 0; j < m; j++) olds[j] = load(pa + pos[i0 + j] * w, w);
        for (int j = 0; j < m; j++) {
            u64 d = load(pk + (i0 + j) * w, w);
            news[j] = is_float ? float_unkey((float_key(olds[j], w) + d) & mask, w)
                               : (olds[j] + d) & mask;
            store(pa + pos[i0 + j] * w, w, news[j]);
        }
        if (!hash) continue;
        for (int j = 0; j < m; j++) q[j] = (u64)pos[i0 + j] + (u64)offset;
        hash_moves(k, packed, q, olds, news, m, s);
    }
    Py_END_ALLOW_THREADS
    RELEASE(&ab, &pb, &kb, &keyb);
    if (bad) return PyErr_Format(PyExc_ValueError, "position out of range");
    return Py_BuildValue("KK", (unsigned long long)s[0], (unsigned long long)s[1]);
}

/* Bit streams, most significant bit first (np.packbits' order). */
typedef struct { uint8_t *p; u64 acc; int used; } BitWriter;

static inline void put(BitWriter *bw, u64 v, int nbits) {  /* nbits <= 57 */
    bw->acc = (bw->acc << nbits) | (nbits ? v & (~0ULL >> (64 - nbits)) : 0);
    bw->used += nbits;
    while (bw->used >= 8) {
        bw->used -= 8;
        *bw->p++ = (uint8_t)(bw->acc >> bw->used);
    }
}

static inline void put_wide(BitWriter *bw, u64 v, int nbits) {  /* nbits <= 64 */
    if (nbits > 32) {
        put(bw, v >> 32, nbits - 32);
        nbits = 32;
    }
    put(bw, v, nbits);
}

static inline void flush(BitWriter *bw) {
    if (bw->used) *bw->p++ = (uint8_t)(bw->acc << (8 - bw->used));
    bw->used = 0;
}

#define QMAX 40  /* entropy.QMAX */

/* rice_encode(v, k) -> (unary, low, escaped, n_escaped) (entropy.rice_encode). */
static PyObject *rice_encode(PyObject *self, PyObject *args) {
    Py_buffer vb;
    int k;
    if (!PyArg_ParseTuple(args, "y*i", &vb, &k)) return NULL;
    if (k < 0 || k > 63) {
        PyBuffer_Release(&vb);
        return PyErr_Format(PyExc_ValueError, "Rice parameter %d outside 0..63", k);
    }
    const u64 *v = vb.buf;
    Py_ssize_t n = vb.len / 8, n_esc = 0;
    u64 unary_bits = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        u64 q = v[i] >> k;
        n_esc += q >= QMAX;
        unary_bits += (q < QMAX ? q : QMAX) + 1;
    }
    Py_END_ALLOW_THREADS
    PyObject *unary = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((unary_bits + 7) / 8));
    PyObject *low = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(((u64)(n - n_esc) * k + 7) / 8));
    PyObject *esc = PyBytes_FromStringAndSize(NULL, n_esc * 8);
    if (!unary || !low || !esc) {
        Py_XDECREF(unary), Py_XDECREF(low), Py_XDECREF(esc);
        PyBuffer_Release(&vb);
        return NULL;
    }
    BitWriter bu = {(uint8_t *)PyBytes_AS_STRING(unary), 0, 0};
    BitWriter bl = {(uint8_t *)PyBytes_AS_STRING(low), 0, 0};
    uint8_t *pe = (uint8_t *)PyBytes_AS_STRING(esc);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        u64 q = v[i] >> k;
        if (q >= QMAX) {
            memcpy(pe, &v[i], 8);
            pe += 8;
            q = QMAX;
        } else {
            put_wide(&bl, v[i], k);
        }
        while (q >= 32) {
            put(&bu, 0, 32);
            q -= 32;
        }
        put(&bu, 1, (int)q + 1);
    }
    flush(&bu);
    flush(&bl);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&vb);
    return Py_BuildValue("NNNn", unary, low, esc, n_esc);
}

/* Bit readers over a stream of `len` bytes, most significant bit first: the count of zeros
 * before the next one (added to *q; 0 if the stream ends first), and k (< 64) bits. */
static inline int next_one(const uint8_t *p, Py_ssize_t len, Py_ssize_t *bit, u64 *q) {
    while (*bit < len * 8) {
        Py_ssize_t byte = *bit >> 3;
        int off = *bit & 7;
        if (byte + 8 <= len) {
            u64 x;
            memcpy(&x, p + byte, 8);
            x = __builtin_bswap64(x) << off;
            if (x) {
                int z = __builtin_clzll(x);
                *q += z;
                *bit += z + 1;
                return 1;
            }
            *q += 64 - off;
            *bit += 64 - off;
        } else {
            int b = (p[byte] >> (7 - off)) & 1;
            ++*bit;
            if (b) return 1;
            ++*q;
        }
    }
    return 0;
}

static inline u64 read_bits(const uint8_t *p, Py_ssize_t len, Py_ssize_t *bit, int k) {
    if (k == 0) return 0;
    Py_ssize_t byte = *bit >> 3;
    int off = *bit & 7;
    u64 x = 0;
    if (byte + 8 <= len && k + off <= 64) {
        memcpy(&x, p + byte, 8);
        x = (__builtin_bswap64(x) << off) >> (64 - k);
        *bit += k;
        return x;
    }
    for (int b = 0; b < k;) {  /* near the end: a byte's worth at a time */
        int o = *bit & 7, take = 8 - o < k - b ? 8 - o : k - b;
        x = (x << take) | ((p[*bit >> 3] >> (8 - o - take)) & ((1u << take) - 1));
        *bit += take;
        b += take;
    }
    return x;
}

/* rice_decode(unary, low, escaped, k, out) (entropy.rice_decode): fills out's n values.
 * Raises ValueError where a stream is short or does not match. */
static PyObject *rice_decode(PyObject *self, PyObject *args) {
    Py_buffer ub, lb, eb, ob;
    int k;
    if (!PyArg_ParseTuple(args, "y*y*y*iw*", &ub, &lb, &eb, &k, &ob)) return NULL;
    const uint8_t *pu = ub.buf, *pl = lb.buf;
    const char *err = NULL;
    u64 *out = ob.buf;
    Py_ssize_t n = ob.len / 8, n_esc = 0, lbits = lb.len * 8, ubit = 0, lbit = 0;
    if (k < 0 || k > 63) err = "Rice parameter outside 0..63";
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !err; i++) {
        u64 q = 0;
        if (!next_one(pu, ub.len, &ubit, &q)) { err = "unary stream too short"; break; }
        if (q == QMAX) {
            if ((n_esc + 1) * 8 > eb.len) { err = "escape stream does not match the unary stream"; break; }
            memcpy(&out[i], (const uint8_t *)eb.buf + n_esc * 8, 8);
            n_esc++;
            continue;
        }
        if (q > QMAX) { err = "unary run longer than an escape"; break; }
        if (lbit + k > lbits) { err = "fixed-width stream too short"; break; }
        out[i] = (q << k) | read_bits(pl, lb.len, &lbit, k);
    }
    Py_END_ALLOW_THREADS
    if (!err && n_esc * 8 != eb.len) err = "escape stream does not match the unary stream";
    RELEASE(&ub, &lb, &eb, &ob);
    if (err) return PyErr_Format(PyExc_ValueError, "%s", err);
    Py_RETURN_NONE;
}

/* The tiered method's reorderings (tiered.encode and tiered.decode; T = threshold, E(x) = the
 * exponent field of x). Values travel as byte planes of the W-bit zigzagged key differences
 * minus 1 (tiered.zigzag): tier S's changed elements first, stably ordered by old exponent
 * (a counting sort over the T exponents below T), then tier R's in position order. */
static inline u64 exponent(u64 x, int w, int mbits) {
    return (x & ((w == 8 ? ~0ULL : (1ULL << (8 * w)) - 1) >> 1)) >> mbits;
}

/* A tier threshold t for w-byte floats with mbits mantissa bits: 0 <= t <= 2^(exponent bits),
 * with m elements in S (0: no tier, so no S; every change is in R). */
static int check_tier(int w, int mbits, Py_ssize_t t, Py_ssize_t m) {
    if (check_width(w)) return -1;
    int ebits = 8 * w - 1 - mbits;
    if (ebits < 1 || ebits > 12 || t < 0 || t > ((Py_ssize_t)1 << ebits)) {
        PyErr_Format(PyExc_ValueError, "threshold %zd out of range for %d-byte floats with %d "
                     "mantissa bits", t, w, mbits);
        return -1;
    }
    if (t == 0 && m > 0) {
        PyErr_Format(PyExc_ValueError, "threshold 0 (no tier) with %zd elements in S", m);
        return -1;
    }
    return 0;
}

static inline u64 zz(u64 d, int w) {  /* W-bit zigzag minus 1, wrapped */
    int bits = 8 * w;
    u64 mask = w == 8 ? ~0ULL : (1ULL << bits) - 1;
    int64_t sd = (int64_t)(d << (64 - bits)) >> (64 - bits);  /* sign-extend */
    return ((((u64)sd << 1) ^ (u64)(sd >> 63)) - 1) & mask;
}

static inline u64 unzz(u64 z, int w) {
    u64 mask = w == 8 ? ~0ULL : (1ULL << (8 * w)) - 1;
    z = (z + 1) & mask;
    return ((z >> 1) ^ (0 - (z & 1))) & mask;
}

/* Counting-sort offsets: off[e] = the number of exponents below e (e < t). NULL on no memory. */
static Py_ssize_t *exponent_offsets(const Py_ssize_t *count, Py_ssize_t t) {
    Py_ssize_t *off = malloc((size_t)(t + 1) * sizeof *off);
    if (!off) return NULL;
    Py_ssize_t run = 0;
    for (Py_ssize_t e = 0; e < t; e++) { off[e] = run; run += count[e]; }
    off[t] = run;
    return off;
}

/* tiered_split(w, mbits, T, S, pos, a_pos, b_pos, ranks_s, ranks_r, planes) -> n_s. For the
 * changes at sorted `pos` (old bits a_pos, new b_pos): ranks_s[:n_s], S's changed elements'
 * indices in S; ranks_r[:n - n_s], R's as ranks among the positions not in S; planes (n * w
 * bytes), the values in coded order. Every element of S must have exponent below T and
 * every other one not (S lists exactly those). */
static PyObject *tiered_split(PyObject *self, PyObject *args) {
    int w, mbits;
    Py_ssize_t t;
    Py_buffer sb, pb, ab, bb, rsb, rrb, zb;
    if (!PyArg_ParseTuple(args, "iiny*y*y*y*w*w*w*", &w, &mbits, &t, &sb, &pb, &ab, &bb, &rsb,
                          &rrb, &zb))
        return NULL;
    Py_ssize_t m = sb.len / 8, n = pb.len / 8;
    if (check_tier(w, mbits, t, m) || need(&ab, n * w, "a_pos") || need(&bb, n * w, "b_pos")
        || need(&rsb, n * 8, "ranks_s") || need(&rrb, n * 8, "ranks_r")
        || need(&zb, n * w, "planes")) {
        RELEASE(&sb, &pb, &ab, &bb, &rsb, &rrb, &zb);
        return NULL;
    }
    Py_ssize_t *count = calloc((size_t)t + 1, sizeof *count), *off = NULL;
    const int64_t *S = sb.buf, *pos = pb.buf;
    const uint8_t *pa = ab.buf, *pbv = bb.buf;
    int64_t *rs = rsb.buf, *rr = rrb.buf;
    uint8_t *z = zb.buf;
    Py_ssize_t n_s = 0, n_r = 0;
    int bad = count == NULL;
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            u64 e = exponent(load(pa + i * w, w), w, mbits);
            if (e < (u64)t) count[e]++;
        }
        off = exponent_offsets(count, t);
        bad = off == NULL;
        Py_ssize_t j = 0, n_small = off ? off[t] : 0;
        for (Py_ssize_t i = 0; i < n && !bad; i++) {
            while (j < m && S[j] < pos[i]) j++;
            u64 old = load(pa + i * w, w), e = exponent(old, w, mbits);
            u64 d = float_key(load(pbv + i * w, w), w) - float_key(old, w);
            Py_ssize_t slot;
            if (e < (u64)t) {
                rs[n_s++] = j;
                slot = off[e]++;
            } else {
                rr[n_r++] = pos[i] - j;
                slot = n_small + n_r - 1;
            }
            u64 v = zz(d, w);
            for (int p = 0; p < w; p++) z[p * n + slot] = (uint8_t)(v >> (8 * p));
        }
        Py_END_ALLOW_THREADS
    }
    free(count);
    free(off);
    RELEASE(&sb, &pb, &ab, &bb, &rsb, &rrb, &zb);
    if (bad) return PyErr_NoMemory();
    return PyLong_FromSsize_t(n_s);
}

/* tiered_join(w, mbits, T, a, S, pos_s, r, planes, pos, kd): the inverse, given the base a:
 * pos = pos_s (S's changed positions, sorted), then the r[i]-th positions not in S; kd = the
 * key differences in that order, read from the planes (S's part in old-exponent order).
 * ValueError for a position outside a or an S element at or above T, before any output. */
static PyObject *tiered_join(PyObject *self, PyObject *args) {
    int w, mbits;
    Py_ssize_t t;
    Py_buffer ab, sb, psb, rb, zb, pb, kb;
    if (!PyArg_ParseTuple(args, "iiny*y*y*y*y*w*w*", &w, &mbits, &t, &ab, &sb, &psb, &rb, &zb,
                          &pb, &kb))
        return NULL;
    Py_ssize_t size = ab.len / (w > 0 ? w : 1), m = sb.len / 8, n_s = psb.len / 8;
    Py_ssize_t n = n_s + rb.len / 8;
    if (check_tier(w, mbits, t, m) || need(&zb, n * w, "planes") || need(&pb, n * 8, "pos")
        || need(&kb, n * w, "kd")) {
        RELEASE(&ab, &sb, &psb, &rb, &zb, &pb, &kb);
        return NULL;
    }
    const uint8_t *pa = ab.buf, *z = zb.buf;
    const int64_t *S = sb.buf, *ps = psb.buf, *r = rb.buf;
    int64_t *pos = pb.buf;
    uint8_t *kd = kb.buf;
    Py_ssize_t *count = calloc((size_t)t + 1, sizeof *count), *off = NULL;
    uint16_t *es = malloc((size_t)(n_s + 1) * sizeof *es);  /* exponents fit 12 bits */
    int nomem = !count || !es;
    const char *err = NULL;
    if (!nomem) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t k = 0, n_r = n - n_s; k < n_r && !err; k++)  /* a stream's ranks */
            if (r[k] < 0 || r[k] >= size - m || (k && r[k] <= r[k - 1]))
                err = "rank out of range";
        for (Py_ssize_t i = 0; i < n_s && !err; i++) {
            if (ps[i] < 0 || ps[i] >= size) { err = "position out of range"; break; }
            u64 e = exponent(load(pa + ps[i] * w, w), w, mbits);
            if (e >= (u64)t) err = "tier S element above the threshold";
            else count[es[i] = (uint16_t)e]++;
        }
        if (!err && !(off = exponent_offsets(count, t))) nomem = 1;
        if (nomem) err = "no memory";
        Py_ssize_t j = 0;
        for (Py_ssize_t i = 0; i < n && !err; i++) {
            Py_ssize_t slot;
            if (i < n_s) {
                pos[i] = ps[i];
                slot = off[es[i]]++;
            } else {
                int64_t ri = r[i - n_s];
                while (j < m && S[j] - j <= ri) j++;
                pos[i] = ri + j;
                slot = i;
            }
            u64 v = 0;
            for (int p = 0; p < w; p++) v |= (u64)z[p * n + slot] << (8 * p);
            store(kd + i * w, w, unzz(v, w));
        }
        Py_END_ALLOW_THREADS
    }
    free(count);
    free(off);
    free(es);
    RELEASE(&ab, &sb, &psb, &rb, &zb, &pb, &kb);
    if (nomem) return PyErr_NoMemory();
    if (err) return PyErr_Format(PyExc_ValueError, "%s", err);
    Py_RETURN_NONE;
}

/* tiered.plan's arithmetic: the zeroth-order position bits for each threshold T, given the
 * element counts s[T] and changed counts hs[T] below it (m log m - k log k - (m-k) log (m-k)
 * per tier, plus price bits per element of S, plus scan bits per element of the tensor for
 * any T > 0: the listing passes). The same formula as tiered._cost; the sums
 * may round differently in the last bit, so a near-tie may pick another threshold (a payload
 * that decodes all the same). -> the first T with the lowest cost; cost[] filled. */
static inline double xlog(double x) { return x > 1.0 ? x * log2(x) : 0.0; }

static Py_ssize_t cheapest(const double *s, const double *hs, Py_ssize_t k, double big_n,
                           double n, double price, double scan, double *cost) {
    Py_ssize_t best = 0;
    for (Py_ssize_t t = 0; t < k; t++) {
        double r = big_n - s[t] > 0 ? big_n - s[t] : 0.0, hr = n - hs[t];
        cost[t] = xlog(s[t]) - xlog(hs[t]) - xlog(s[t] - hs[t]) + xlog(r) - xlog(hr)
                  - xlog(r - hr) + price * s[t] + (t ? scan * big_n : 0.0);
        if (cost[t] < cost[best]) best = t;
    }
    return best;
}

/* plan(w, mbits, a, e_changed, sample, price, scan, min_gain) -> (T, S bytes) or (0, None):
 * tiered.plan in one call (its docstring says how). S: the sorted int64 positions of the
 * elements of `a` with exponent below T. */
static PyObject *plan(PyObject *self, PyObject *args) {
    int w, mbits;
    Py_ssize_t sample;
    double price, scan, min_gain;
    Py_buffer ab, eb;
    if (!PyArg_ParseTuple(args, "iiy*y*nddd", &w, &mbits, &ab, &eb, &sample, &price, &scan,
                          &min_gain))
        return NULL;
    if (check_tier(w, mbits, 1, 0) || sample < 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "sample must be at least 1");
        RELEASE(&ab, &eb);
        return NULL;
    }
    Py_ssize_t size = ab.len / w, n = eb.len / w, n_e = (Py_ssize_t)1 << (8 * w - 1 - mbits);
    const uint8_t *pa = ab.buf, *pe = eb.buf;
    double *buf = calloc((size_t)(6 * (n_e + 1)), sizeof *buf);
    int64_t *S = NULL;
    Py_ssize_t best = 0, count = 0;
    int nomem = buf == NULL;
    if (!nomem) {
        Py_BEGIN_ALLOW_THREADS
        double *hit = buf, *hs = hit + (n_e + 1), *cnt = hs + (n_e + 1), *cs = cnt + (n_e + 1);
        double *cost = cs + (n_e + 1), *smp = cost + (n_e + 1);
        for (Py_ssize_t i = 0; i < n; i++) {  /* e_changed holds exponents already */
            u64 e = load(pe + i * w, w);
            if (e < (u64)n_e) hit[e] += 1.0;
        }
        Py_ssize_t step = size / sample > 1 ? size / sample : 1, taken = 0;
        for (Py_ssize_t i = 0; i < size; i += step, taken++)
            smp[exponent(load(pa + i * w, w), w, mbits)] += 1.0;
        double scale = taken ? (double)size / (double)taken : 0.0;
        for (Py_ssize_t e = 0; e < n_e; e++) {
            double c = smp[e] * scale;
            cnt[e] = c > hit[e] ? c : hit[e];
            hs[e + 1] = hs[e] + hit[e];
            cs[e + 1] = cs[e] + cnt[e];
        }
        Py_ssize_t guess = cheapest(cs, hs, n_e + 1, (double)size, (double)n, price, scan,
                                     cost);
        if (guess > 0) {
            /* list S for the guess, then its exact counts (in cs) may lower T */
            Py_ssize_t cap = 1024, i = 0;
            u64 mag = (w == 8 ? ~0ULL : (1ULL << (8 * w)) - 1) >> 1;
            while (!nomem) {
                int64_t *grown = realloc(S, (size_t)cap * sizeof *S);
                if (!grown) { nomem = 1; break; }
                S = grown;
                Py_ssize_t got = 0;
                i = small_kernel(w, pa, mag, (u64)guess << mbits, size, i, cap - count,
                                 S + count, &got);
                count += got;
                if (i >= size) break;
                cap *= 2;
            }
            if (!nomem) {
                memset(cnt, 0, (size_t)(n_e + 1) * sizeof *cnt);
                for (Py_ssize_t j = 0; j < count; j++)
                    cnt[exponent(load(pa + S[j] * w, w), w, mbits)] += 1.0;
                for (Py_ssize_t e = 0; e < guess; e++) cs[e + 1] = cs[e] + cnt[e];
                best = cheapest(cs, hs, guess + 1, (double)size, (double)n, price, scan, cost);
                if (best == 0 || cost[best] >= (1 - min_gain) * cost[0]) best = 0;
                else if (best < guess) {  /* keep the elements below best, in place */
                    Py_ssize_t c = 0;
                    for (Py_ssize_t j = 0; j < count; j++)
                        if (exponent(load(pa + S[j] * w, w), w, mbits) < (u64)best) S[c++] = S[j];
                    count = c;
                }
            }
        }
        Py_END_ALLOW_THREADS
    }
    free(buf);
    RELEASE(&ab, &eb);
    if (nomem) {
        free(S);
        return PyErr_NoMemory();
    }
    PyObject *out = best ? PyBytes_FromStringAndSize((const char *)S, count * 8) : NULL;
    free(S);
    if (best && !out) return NULL;
    if (!best) return Py_BuildValue("nO", (Py_ssize_t)0, Py_None);
    return Py_BuildValue("nN", best, out);
}

static PyMethodDef methods[] = {
    {"changes", changes, METH_VARARGS, "positions where two arrays differ, and both values"},
    {"bf16_changes", bf16_changes, METH_VARARGS, "positions where two fp32 arrays' bf16 casts "
     "differ, and both casts"},
    {"small", small, METH_VARARGS, "positions whose magnitude bits are below a bound"},
    {"change_sum", change_sum, METH_VARARGS, "the additive hash's movement from changes"},
    {"apply_keys", apply_keys, METH_VARARGS, "apply key differences, with the hash's movement"},
    {"rice_encode", rice_encode, METH_VARARGS, "Rice-code uint64 values"},
    {"rice_decode", rice_decode, METH_VARARGS, "decode Rice-coded uint64 values"},
    {"plan", plan, METH_VARARGS, "the tiered method's threshold and tier S"},
    {"tiered_split", tiered_split, METH_VARARGS, "the tiered method's ranks and value planes"},
    {"tiered_join", tiered_join, METH_VARARGS, "the tiered method's positions and values"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
