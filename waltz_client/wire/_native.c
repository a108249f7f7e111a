/* The per-record loops of the hot paths, compiled: checking a batch of wire records as it
 * arrives, converting records between the wire and a segment's disk layout, checking
 * every record of a segment when a node opens it, and the CRC-32 they all need.
 *
 * Every function here is an accelerator of a pure-Python loop that stays the reference
 * (waltz_client/wire/records.py, waltz_storage/segment.py): the check and the read
 * return None on anything wrong, the open's scan stops before it, and the Python loop
 * runs again to say precisely what.
 * The layouts (big-endian):
 *
 *   wire record: i64 txid | 4 x i32 ReqId | i32 header | i32 data length | data
 *                | u32 CRC-32 of data                                (32-byte head)
 *   disk record: the wire head | u32 data CRC-32 | data | u32 CRC-32 of those 36 bytes
 *
 * CRC-32 is zlib's (reflected polynomial 0xEDB88320): carry-less multiplication folding
 * (Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ") where the CPU
 * has it, tables eight bytes at a time elsewhere.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define WALTZ_CLMUL 1
#endif

/* A record's head: txid, ReqId, header, data length (format 1, 32 bytes), then the
 * commit time (format 2, 40 bytes). The data length is at offset 28 in both; on disk the
 * data CRC follows the head, and the head's CRC follows the data. */
#define WIRE_HEAD_V1 32
#define WIRE_HEAD_V2 40
#define LENGTH_AT 28
#define DISK_HEAD(head) ((head) + 4)     /* the wire head and the data CRC */
#define DISK_OVERHEAD(head) ((head) + 8) /* DISK_HEAD and the head's CRC */

/* The `head` argument: a wire head size this build knows, else ValueError. */
static int
check_head(Py_ssize_t head)
{
    if (head == WIRE_HEAD_V1 || head == WIRE_HEAD_V2)
        return 0;
    PyErr_Format(PyExc_ValueError, "a record head is %d or %d bytes, not %zd", WIRE_HEAD_V1,
                 WIRE_HEAD_V2, head);
    return -1;
}
/* crc32 of this much or more lets other threads run meanwhile (a storage node's I/O
 * thread, its HTTP thread): releasing the GIL costs more than checking less. */
#define GIL_FREE_BYTES (256 * 1024)

/* --- CRC-32 --------------------------------------------------------------------------- */

static uint32_t crc_table[8][256];
static int have_clmul;

static void
crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
#ifdef WALTZ_CLMUL
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

/* The CRC register (the inverted CRC) advanced over p[0..n), by tables. */
static uint32_t
crc_tables(uint32_t reg, const uint8_t *p, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        uint32_t lo = (uint32_t)v ^ reg, hi = (uint32_t)(v >> 32);
        reg = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
              crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        reg = crc_table[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
    return reg;
}

#ifdef WALTZ_CLMUL
/* The register advanced over p[0..n), n >= 64 and a multiple of 16: four 128-bit lanes
 * folded 64 bytes at a time, folded into one, then Barrett-reduced to 32 bits. The
 * constants are x^k mod P(x) for the paper's k, bit-reflected, and P(x) and its
 * quotient mu for the reduction. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc_clmul(uint32_t reg, const uint8_t *p, size_t n)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)reg));
    x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
    while (n >= 64) {
        x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)p));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    /* Four lanes into one. */
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x2), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x3), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x4), x5);
    /* The remaining 16-byte blocks. */
    while (n >= 16) {
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)p)), x5);
        p += 16;
        n -= 16;
    }
    /* 128 bits to 64. */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, low32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k5k0, 0x00), x2);
    /* Barrett reduction to 32. */
    x2 = _mm_and_si128(x1, low32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x10);
    x2 = _mm_and_si128(x2, low32);
    x2 = _mm_clmulepi64_si128(x2, poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static uint32_t
crc32_of(uint32_t crc, const uint8_t *p, size_t n)
{
    uint32_t reg = ~crc;
#ifdef WALTZ_CLMUL
    if (have_clmul && n >= 64) {
        size_t folded = n & ~(size_t)15;
        reg = crc_clmul(reg, p, folded);
        p += folded;
        n -= folded;
    }
#endif
    return ~crc_tables(reg, p, n);
}

/* --- big-endian fields ---------------------------------------------------------------- */

static inline uint32_t
be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline int64_t
be64(const uint8_t *p)
{
    return (int64_t)(((uint64_t)be32(p) << 32) | be32(p + 4));
}

static inline void
put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* (txid, offset, data length): a RecordBatch's span. */
static PyObject *
span(int64_t txid, Py_ssize_t offset, Py_ssize_t length)
{
    PyObject *t = PyTuple_New(3);
    if (t == NULL)
        return NULL;
    PyObject *a = PyLong_FromLongLong(txid), *b = PyLong_FromSsize_t(offset),
             *c = PyLong_FromSsize_t(length);
    if (a == NULL || b == NULL || c == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(c);
        Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, b);
    PyTuple_SET_ITEM(t, 2, c);
    return t;
}

/* --- the module's functions ----------------------------------------------------------- */

static uint32_t
crc32_chosen(uint32_t crc, const uint8_t *p, size_t n, int tables_only)
{
    return tables_only ? ~crc_tables(~crc, p, n) : crc32_of(crc, p, n);
}

/* crc32(data, value=0) for both entry points; other threads run over large buffers (the
 * buffer is exported meanwhile: nobody can resize it). */
static PyObject *
crc32_call(PyObject *args, const char *format, int tables_only)
{
    Py_buffer view;
    unsigned int start = 0;
    if (!PyArg_ParseTuple(args, format, &view, &start))
        return NULL;
    uint32_t crc;
    if (view.len >= GIL_FREE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc32_chosen(start, view.buf, (size_t)view.len, tables_only);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc32_chosen(start, view.buf, (size_t)view.len, tables_only);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(crc32_doc, "crc32(data, value=0, /) -> int\n\n"
                        "zlib's CRC-32 of a bytes-like object, continuing from value.");

static PyObject *
native_crc32(PyObject *module, PyObject *args)
{
    return crc32_call(args, "y*|I:crc32", 0);
}

PyDoc_STRVAR(crc32_tables_doc, "crc32_tables(data, value=0, /) -> int\n\n"
                               "crc32 by the tables alone, as where the CPU cannot fold.");

static PyObject *
native_crc32_tables(PyObject *module, PyObject *args)
{
    return crc32_call(args, "y*|I:crc32_tables", 1);
}

PyDoc_STRVAR(scan_wire_doc,
             "scan_wire(buf, count, max_data_bytes, head=32, /) -> list[tuple[int, int, int]] | None\n\n"
             "The spans of exactly `count` wire records (heads of `head` bytes) filling `buf`,\n"
             "each with a data length in 0..max_data_bytes and a matching data CRC; None if\n"
             "anything is wrong.");

static PyObject *
native_scan_wire(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t count, head = WIRE_HEAD_V1;
    long long max_data_bytes;
    if (!PyArg_ParseTuple(args, "y*nL|n:scan_wire", &view, &count, &max_data_bytes, &head))
        return NULL;
    if (check_head(head) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *buf = view.buf;
    Py_ssize_t end = view.len, pos = 0;
    PyObject *spans = NULL;
    /* Every record takes at least head + 4 bytes: a count beyond that is not allocated. */
    if (count < 0 || count > end / (head + 4))
        goto invalid;
    spans = PyList_New(count);
    if (spans == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (end - pos < head)
            goto invalid;
        int32_t length = (int32_t)be32(buf + pos + LENGTH_AT);
        if (length < 0 || length > max_data_bytes)
            goto invalid;
        Py_ssize_t data = pos + head, data_end = data + length;
        if (end - data_end < 4)
            goto invalid;
        if (crc32_of(0, buf + data, (size_t)length) != be32(buf + data_end))
            goto invalid;
        PyObject *s = span(be64(buf + pos), pos, length);
        if (s == NULL)
            goto error;
        PyList_SET_ITEM(spans, i, s);
        pos = data_end + 4;
    }
    if (pos != end)
        goto invalid;
    PyBuffer_Release(&view);
    return spans;
invalid:
    Py_XDECREF(spans);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
error:
    Py_XDECREF(spans);
    PyBuffer_Release(&view);
    return NULL;
}

/* A span's offset and data length, checked to lie within a buffer of `size` bytes. */
static int
span_extent(PyObject *item, Py_ssize_t size, Py_ssize_t head, Py_ssize_t *offset,
            Py_ssize_t *length)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
        PyErr_SetString(PyExc_TypeError, "a span is a (txid, offset, length) tuple");
        return -1;
    }
    *offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
    *length = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
    if ((*offset == -1 || *length == -1) && PyErr_Occurred())
        return -1;
    if (*offset < 0 || *length < 0 || *offset > size - head - 4 ||
        *length > size - head - 4 - *offset) {
        PyErr_Format(PyExc_ValueError, "span (offset %zd, length %zd) is outside the %zd-byte batch",
                     *offset, *length, size);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(wire_to_disk_doc,
             "wire_to_disk(buf, spans, start, stop, out, head=32, /) -> list[int]\n\n"
             "Append records start..stop of a checked wire batch (heads of `head` bytes) to\n"
             "the bytearray `out` in disk layout; each record's length on disk.");

static PyObject *
native_wire_to_disk(PyObject *module, PyObject *args)
{
    Py_buffer view;
    PyObject *spans, *out, *sizes = NULL;
    Py_ssize_t start, stop, head = WIRE_HEAD_V1;
    if (!PyArg_ParseTuple(args, "y*O!nnO!|n:wire_to_disk", &view, &PyList_Type, &spans, &start,
                          &stop, &PyByteArray_Type, &out, &head))
        return NULL;
    if (check_head(head) < 0)
        goto error;
    Py_ssize_t n = PyList_GET_SIZE(spans);
    if (start < 0 || stop > n || start > stop) {
        PyErr_Format(PyExc_IndexError, "records %zd..%zd of a batch of %zd", start, stop, n);
        goto error;
    }
    Py_ssize_t total = 0, offset, length;
    for (Py_ssize_t i = start; i < stop; i++) {
        if (span_extent(PyList_GET_ITEM(spans, i), view.len, head, &offset, &length) < 0)
            goto error;
        total += length + DISK_OVERHEAD(head);
    }
    sizes = PyList_New(stop - start);
    if (sizes == NULL)
        goto error;
    Py_ssize_t written = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, written + total) < 0)
        goto error;
    const uint8_t *src = view.buf;
    uint8_t *dst = (uint8_t *)PyByteArray_AS_STRING(out) + written;
    for (Py_ssize_t i = start; i < stop; i++) {
        /* checked above */
        span_extent(PyList_GET_ITEM(spans, i), view.len, head, &offset, &length);
        const uint8_t *rec = src + offset;
        memcpy(dst, rec, (size_t)head);
        memcpy(dst + head, rec + head + length, 4);
        memcpy(dst + DISK_HEAD(head), rec + head, (size_t)length);
        put_be32(dst + DISK_HEAD(head) + length, crc32_of(0, dst, (size_t)DISK_HEAD(head)));
        PyObject *size = PyLong_FromSsize_t(length + DISK_OVERHEAD(head));
        if (size == NULL)
            goto error;
        PyList_SET_ITEM(sizes, i - start, size);
        dst += length + DISK_OVERHEAD(head);
    }
    PyBuffer_Release(&view);
    return sizes;
error:
    Py_XDECREF(sizes);
    PyBuffer_Release(&view);
    return NULL;
}

PyDoc_STRVAR(disk_to_wire_doc,
             "disk_to_wire(buf, first_txid, ends, head=32, /) -> tuple[bytes, list] | None\n\n"
             "The disk records in `buf` (heads of `head` wire bytes; record i of transaction\n"
             "first_txid + i ending at ends[i]) checked and converted to a wire batch's bytes\n"
             "and spans; None if any record is not whole and valid where the ends put it.");

static PyObject *
native_disk_to_wire(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long long first_txid;
    PyObject *ends_arg, *ends = NULL, *wire = NULL, *spans = NULL;
    Py_ssize_t head = WIRE_HEAD_V1;
    if (!PyArg_ParseTuple(args, "y*LO|n:disk_to_wire", &view, &first_txid, &ends_arg, &head))
        return NULL;
    if (check_head(head) < 0)
        goto error;
    ends = PySequence_Fast(ends_arg, "ends must be a sequence of offsets");
    if (ends == NULL)
        goto error;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ends);
    long long last_txid;
    if (n > 0 && __builtin_add_overflow(first_txid, (long long)(n - 1), &last_txid))
        goto invalid; /* past the largest i64 ID: Python's loop says where */
    PyObject **items = PySequence_Fast_ITEMS(ends);
    /* The ends first: each record at least its overhead long, all within the buffer. */
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t end = PyLong_AsSsize_t(items[i]);
        if (end == -1 && PyErr_Occurred())
            goto error;
        if (end - pos < DISK_OVERHEAD(head) || end > view.len)
            goto invalid;
        pos = end;
    }
    wire = PyBytes_FromStringAndSize(NULL, pos - 4 * n);
    spans = PyList_New(n);
    if (wire == NULL || spans == NULL)
        goto error;
    const uint8_t *src = view.buf;
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(wire);
    Py_ssize_t out = 0;
    pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t end = PyLong_AsSsize_t(items[i]);
        const uint8_t *rec = src + pos;
        Py_ssize_t length = (int32_t)be32(rec + LENGTH_AT);
        if (be64(rec) != first_txid + i || length < 0 ||
            pos + DISK_HEAD(head) + length != end - 4 ||
            crc32_of(0, rec, (size_t)DISK_HEAD(head)) != be32(src + end - 4) ||
            crc32_of(0, rec + DISK_HEAD(head), (size_t)length) != be32(rec + head))
            goto invalid;
        memcpy(dst + out, rec, (size_t)head);
        memcpy(dst + out + head, rec + DISK_HEAD(head), (size_t)length);
        memcpy(dst + out + head + length, rec + head, 4);
        PyObject *s = span(first_txid + i, out, length);
        if (s == NULL)
            goto error;
        PyList_SET_ITEM(spans, i, s);
        out += DISK_HEAD(head) + length;
        pos = end;
    }
    Py_DECREF(ends);
    PyBuffer_Release(&view);
    PyObject *result = PyTuple_Pack(2, wire, spans);
    Py_DECREF(wire);
    Py_DECREF(spans);
    return result;
invalid:
    Py_XDECREF(ends);
    Py_XDECREF(wire);
    Py_XDECREF(spans);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
error:
    Py_XDECREF(ends);
    Py_XDECREF(wire);
    Py_XDECREF(spans);
    PyBuffer_Release(&view);
    return NULL;
}

PyDoc_STRVAR(first_gap_doc,
             "first_gap(spans, expected, /) -> int\n\n"
             "The index of the first span whose txid is not expected + its index; len(spans)\n"
             "if they all follow on.");

static PyObject *
native_first_gap(PyObject *module, PyObject *args)
{
    PyObject *spans;
    long long expected;
    if (!PyArg_ParseTuple(args, "O!L:first_gap", &PyList_Type, &spans, &expected))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(spans);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(spans, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "a span is a (txid, offset, length) tuple");
            return NULL;
        }
        int overflow;
        long long txid = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(item, 0), &overflow);
        if (txid == -1 && PyErr_Occurred())
            return NULL;
        long long wanted;
        if (overflow || __builtin_add_overflow(expected, (long long)i, &wanted) || txid != wanted)
            return PyLong_FromSsize_t(i);
    }
    return PyLong_FromSsize_t(n);
}

PyDoc_STRVAR(scan_disk_doc,
             "scan_disk(buf, start, expected_txid, base, head=32, /) -> tuple[int, int, bytes]\n\n"
             "Walks the disk records of `buf` from offset `start` while each is whole in\n"
             "`buf` and valid (transaction expected_txid, then the next; both CRCs match):\n"
             "(the offset where it stopped, the next expected transaction, the records'\n"
             "offsets plus `base` as native 64-bit integers for array('q').frombytes). It\n"
             "stops before the first record that is cut off by the end of `buf`, has a\n"
             "negative length or is not valid: the caller's Python loop takes that one.");

/* Opening a segment checks every record: this is that loop's common case, with no
 * Python per record. Where it stops, scan_records in segment.py looks at the record
 * itself and says what is wrong, so nothing here decides a problem's wording. */
static PyObject *
native_scan_disk(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start;
    long long expected, base;
    Py_ssize_t head = WIRE_HEAD_V1;
    if (!PyArg_ParseTuple(args, "y*nLL|n:scan_disk", &view, &start, &expected, &base, &head))
        return NULL;
    if (check_head(head) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (start < 0 || start > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start is outside the buffer");
        return NULL;
    }
    /* At most one record a DISK_OVERHEAD bytes. */
    Py_ssize_t most = (view.len - start) / DISK_OVERHEAD(head);
    int64_t *found = PyMem_RawMalloc((size_t)(most > 0 ? most : 1) * sizeof(int64_t));
    if (found == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    const uint8_t *buf = view.buf;
    Py_ssize_t len = view.len, pos = start, count = 0;
    int64_t txid = expected;
    int free_gil = len - start >= GIL_FREE_BYTES;
    PyThreadState *saved = free_gil ? PyEval_SaveThread() : NULL;
    while (len - pos >= DISK_HEAD(head)) {
        const uint8_t *rec = buf + pos;
        Py_ssize_t length = (int32_t)be32(rec + LENGTH_AT);
        if (length < 0 || length > len - pos - DISK_OVERHEAD(head))
            break; /* cut off by the buffer's end, or a negative length */
        Py_ssize_t data_end = pos + DISK_HEAD(head) + length;
        if (txid == INT64_MAX) /* the last ID there is: Python's loop takes it */
            break;
        if (be64(rec) != txid ||
            crc32_of(0, rec, (size_t)DISK_HEAD(head)) != be32(buf + data_end) ||
            crc32_of(0, rec + DISK_HEAD(head), (size_t)length) != be32(rec + head))
            break;
        if (__builtin_add_overflow((int64_t)base, (int64_t)pos, &found[count]))
            break;
        count++;
        txid++;
        pos = data_end + 4;
    }
    if (saved != NULL)
        PyEval_RestoreThread(saved);
    PyBuffer_Release(&view);
    PyObject *offsets =
        PyBytes_FromStringAndSize((const char *)found, count * (Py_ssize_t)sizeof(int64_t));
    PyMem_RawFree(found);
    if (offsets == NULL)
        return NULL;
    return Py_BuildValue("nLN", pos, (long long)txid, offsets);
}

static PyMethodDef native_methods[] = {
    {"crc32", native_crc32, METH_VARARGS, crc32_doc},
    {"crc32_tables", native_crc32_tables, METH_VARARGS, crc32_tables_doc},
    {"scan_wire", native_scan_wire, METH_VARARGS, scan_wire_doc},
    {"wire_to_disk", native_wire_to_disk, METH_VARARGS, wire_to_disk_doc},
    {"disk_to_wire", native_disk_to_wire, METH_VARARGS, disk_to_wire_doc},
    {"first_gap", native_first_gap, METH_VARARGS, first_gap_doc},
    {"scan_disk", native_scan_disk, METH_VARARGS, scan_disk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    "_native",
    "The per-record loops of the hot paths, compiled (see waltz_client/wire/native.py).",
    -1,
    native_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    crc_init();
    PyObject *m = PyModule_Create(&native_module);
    if (m != NULL && PyModule_AddIntConstant(m, "CLMUL", have_clmul) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
