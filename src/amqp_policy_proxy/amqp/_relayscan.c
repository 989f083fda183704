/* Sans-IO. Optional C accelerator for the proxy's client relay loop
 * (amqp_policy_proxy.core.fastpath.FastPath.relay).
 *
 * scan(buf, pos, end, limit, channel, handle, max_size, user_id, delivery)
 *     -> (pos, transfers, delivery)
 * message_head(buf, pos, end, last) -> (user_id, to, False, complete) | None  (see there)
 * open_head(body, strict) -> the fields of handshake.read_open_head | None  (see there)
 * transfer_fields(buf, pos, end) -> the TransferFields of transfer.read_transfer_fields | None
 * sasl_init(buf, pos, end), sasl_mechanisms(buf, pos, end): handshake's SASL readers  (there)
 * scan_router(buf, pos, end, limit) -> (pos, transfers)  (the router side's run, see there)
 *
 * scan() walks the consecutive frames of buf[pos:end] while each one is either
 *   - an empty AMQP frame (heartbeat, any channel), or
 *   - a Transfer (descriptor 0x00 0x53 0x14) on `channel` for link `handle`, not aborted,
 *     that keeps its delivery within `max_size` payload bytes (max_size < 0: no limit),
 *     encoded in the forms amqp_policy_proxy.amqp.transfer.read_transfer_fields reads
 *     inline: list8/list32 with 1 to 6 fields, uint as 0x43/0x52/0x70 (delivery-id and
 *     message-format may be null), delivery-tag as binary8 or null, booleans as
 *     0x41/0x42/null, and whose fields exactly fill the list's size (canonical: a field
 *     hidden inside the size past the count would be read by the router, which reads lists
 *     by their size).
 * A Transfer may be a whole delivery, the first frame of a multi-frame delivery (`more`) or a
 * later frame of the delivery in progress. `delivery` carries that delivery across calls and
 * frames: None between deliveries, else (payload bytes so far, its first frame's
 * delivery-id or None, whether a frame of it was settled); the call returns it as it stands
 * after the last frame passed (Part 2 §2.6.12, the same bookkeeping as
 * amqp_policy_proxy.core.deliveries.Deliveries.client_transfer).
 * With `user_id` (bytes, not None) the link carries QDR's per-message user-id check
 * (allowUserIdProxy false): a whole delivery is passed only when its message head is one
 * head_ok() reads whole (see there) and its properties.user-id is absent, null or exactly
 * `user_id`; the first frame of a multi-frame delivery stops the run. Every other head (a
 * denial, or an encoding only the Python reader judges) stops the run, and
 * amqp_policy_proxy.amqp.message.read_message_head decides in Python.
 * It stops at the first frame that is anything else, including every frame header the
 * Python loop would look at twice (size above `limit`, below 8, doff < 2, doff*4 > size,
 * a non-AMQP frame type) and a frame not wholly inside buf[:end]. The Python loop then
 * handles that frame with its general handlers, so every decision (denial, maxMessageSize,
 * protocol errors, other links and sessions) stays in Python.
 *
 * Returns the offset reached (the first frame not consumed; `pos` itself when nothing was),
 * the number of Transfers passed and the delivery in progress. The caller guarantees that
 * (channel, handle) is an attached sender link that needs no per-message decision (or only
 * the user-id check) and whose delivery in progress, if any, is not being discarded.
 *
 * Safety: every read is bounds-checked against the frame end, itself checked against `end`,
 * itself clamped to the buffer's length; no size from the wire is added before it has been
 * compared with the room left, so nothing can overflow or read past `end`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* A uint at b[p] (p < lend is checked here): 0x43, 0x52 or 0x70, or 0x40 when nullable.
 * Returns the offset past it, or -1 (stop: the Python loop decides). Always inlined: it is
 * called three times per Transfer on the scanner's path. */
static inline __attribute__((always_inline))
Py_ssize_t read_uint(const unsigned char *b, Py_ssize_t p, Py_ssize_t lend, int nullable,
                     int64_t *out) {
    if (p >= lend) return -1;
    switch (b[p]) {
    case 0x43:
        *out = 0;
        return p + 1;
    case 0x52:
        if (lend - p < 2) return -1;
        *out = b[p + 1];
        return p + 2;
    case 0x70:
        if (lend - p < 5) return -1;
        *out = be32(b + p + 1);
        return p + 5;
    case 0x40:
        if (!nullable) return -1;
        *out = -1;
        return p + 1;
    default:
        return -1;
    }
}

/* A boolean at b[p]: 0x41 true, 0x42 or null false. -1 = stop. */
static inline __attribute__((always_inline))
Py_ssize_t read_bool(const unsigned char *b, Py_ssize_t p, Py_ssize_t lend, int *out) {
    if (p >= lend) return -1;
    switch (b[p]) {
    case 0x41:
        *out = 1;
        return p + 1;
    case 0x42:
    case 0x40:
        *out = 0;
        return p + 1;
    default:
        return -1;
    }
}

/* The fields of a Transfer the scanner reads (the first six: Part 2 §2.7.5). */
struct transfer {
    int64_t handle, delivery_id; /* delivery_id -1: null or absent */
    int settled, more;
    Py_ssize_t payload;          /* offset of the first byte after the list */
    Py_ssize_t tag;              /* offset of a binary8 delivery-tag's constructor, else -1 */
};

/* The Transfer whose body (descriptor) starts at b[body], frame ending at fend (body + 3 <
 * fend is checked by the caller). Returns 1 with *t filled when its list is one the scanner
 * reads (see the top of the file), else 0. */
static inline int plain_transfer(const unsigned char *b, Py_ssize_t body, Py_ssize_t fend,
                                 struct transfer *t) {
    Py_ssize_t p = body + 3, lend;
    uint32_t count;
    if (b[p] == 0xC0) {                                   /* list8: size, count */
        if (fend - p < 3) return 0;
        uint32_t lsize = b[p + 1];
        if (lsize < 1 || (Py_ssize_t)lsize > fend - (p + 2)) return 0;
        lend = p + 2 + (Py_ssize_t)lsize;
        count = b[p + 2];
        p += 3;
    } else if (b[p] == 0xD0) {                            /* list32: size, count */
        if (fend - p < 9) return 0;
        uint32_t lsize = be32(b + p + 1);
        if (lsize < 4 || (uint64_t)lsize > (uint64_t)(fend - (p + 5))) return 0;
        lend = p + 5 + (Py_ssize_t)lsize;
        count = be32(b + p + 5);
        p += 9;
    } else {
        return 0;
    }
    if (count < 1 || count > 6) return 0;                 /* > 6: rcv-settle-mode.. aborted */
    int64_t ignored;
    t->delivery_id = -1;
    t->tag = -1;
    t->settled = t->more = 0;
    p = read_uint(b, p, lend, 0, &t->handle);
    if (p < 0) return 0;
    if (count > 1) {                                      /* delivery-id */
        p = read_uint(b, p, lend, 1, &t->delivery_id);
        if (p < 0) return 0;
    }
    if (count > 2) {                                      /* delivery-tag */
        if (p >= lend) return 0;
        if (b[p] == 0xA0) {
            if (lend - p < 2) return 0;
            Py_ssize_t n = b[p + 1];
            if (n > lend - (p + 2)) return 0;
            t->tag = p;
            p += 2 + n;
        } else if (b[p] == 0x40) {
            p += 1;
        } else {
            return 0;
        }
    }
    if (count > 3) {                                      /* message-format */
        p = read_uint(b, p, lend, 1, &ignored);
        if (p < 0) return 0;
    }
    if (count > 4) {
        p = read_bool(b, p, lend, &t->settled);
        if (p < 0) return 0;
    }
    if (count > 5) {
        p = read_bool(b, p, lend, &t->more);
        if (p < 0) return 0;
    }
    if (p != lend) return 0;                              /* count and size disagree */
    t->payload = lend;
    return 1;
}

/* 0 when an entry point got `want` arguments, else -1 with a TypeError naming its `usage`. */
static int arity(Py_ssize_t nargs, Py_ssize_t want, const char *usage) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
    return -1;
}

/* The truth of the last of an entry point's `want` arguments (its flag) in *flag: 0, or -1
 * with an exception (a wrong count: a TypeError naming `usage`, see arity()). */
static int flag_last(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                     const char *usage, int *flag) {
    if (arity(nargs, want, usage) < 0) return -1;
    *flag = PyObject_IsTrue(args[want - 1]);
    return *flag < 0 ? -1 : 0;
}

/* The window buf[pos:end] named by a call's first three arguments (buf, pos, end): the
 * buffer (the caller releases it with PyBuffer_Release), `pos` checked to be inside it, `end`
 * clamped to [pos, len(buf)]. Returns 0, or -1 with an exception set (nothing to release). */
static int open_window(PyObject *const *args, Py_buffer *view, Py_ssize_t *pos,
                       Py_ssize_t *end) {
    *pos = PyLong_AsSsize_t(args[1]);
    *end = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return -1;
    if (PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) < 0) return -1;
    if (*pos < 0 || *pos > view->len) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "pos outside the buffer");
        return -1;
    }
    if (*end > view->len) *end = view->len;
    if (*end < *pos) *end = *pos;
    return 0;
}

/* The Python type of the Transfer fields, amqp_policy_proxy.amqp.transfer.TransferFields (a
 * NamedTuple: a tuple subclass with no state of its own), looked up when the module is
 * initialised. */
static PyTypeObject *fields_type;

/* transfer_fields(buf, pos, end) -> TransferFields(handle, delivery_id, settled, more, False,
 *                                    payload_offset, tag_offset) or None
 *
 * What amqp_policy_proxy.amqp.transfer.read_transfer_fields answers for the Transfer whose
 * descriptor (0x00 0x53 0x14) starts at buf[pos], its frame ending at `end` (clamped to the
 * buffer), read in C where plain_transfer() reads it (the forms real clients use, no aborted
 * field); None for anything else: the Python reader then reads it, or raises. A property test
 * checks that every answer equals Python's. */
static PyObject *transfer_fields(PyObject *Py_UNUSED(self), PyObject *const *args,
                                 Py_ssize_t nargs) {
    if (arity(nargs, 3, "transfer_fields(buf, pos, end)") < 0) return NULL;
    Py_buffer view;
    Py_ssize_t pos, end;
    if (open_window(args, &view, &pos, &end) < 0) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    struct transfer t;
    PyObject *result;
    if (end - pos > 3 && b[pos] == 0x00 && b[pos + 1] == 0x53 && b[pos + 2] == 0x14
            && plain_transfer(b, pos, end, &t)) {
        /* the NamedTuple built as its tuple_subtype_new would: allocated with its 7 items,
         * each set once (what a tuple's constructor does; the type adds no state) */
        PyObject *items[7] = {
            PyLong_FromLongLong((long long)t.handle),
            t.delivery_id < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(t.delivery_id),
            Py_NewRef(t.settled ? Py_True : Py_False),
            Py_NewRef(t.more ? Py_True : Py_False),
            Py_NewRef(Py_False),
            PyLong_FromSsize_t(t.payload),
            PyLong_FromSsize_t(t.tag),
        };
        result = fields_type->tp_alloc(fields_type, 7);
        for (Py_ssize_t i = 0; i < 7; i++) {
            if (items[i] == NULL && result != NULL) Py_CLEAR(result);
        }
        if (result == NULL) {
            for (Py_ssize_t i = 0; i < 7; i++) Py_XDECREF(items[i]);
        } else {
            for (Py_ssize_t i = 0; i < 7; i++) PyTuple_SET_ITEM(result, i, items[i]);
        }
    } else {
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&view);
    return result;
}

/* The AMQP frame at b[pos] (end - pos >= 8 checked by the caller): its end, with *body set to
 * where its body starts, when its header keeps the rule of
 * amqp_policy_proxy.amqp.framing.frame_header_ok (SIZE 8..limit, DOFF >= 2 and inside the
 * frame, TYPE 0) and it lies wholly inside b[:end]; else -1 (the Python loop looks at it). */
static inline Py_ssize_t whole_frame(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end,
                                     long long limit, Py_ssize_t *body) {
    const unsigned char *h = b + pos;
    uint32_t size = be32(h);
    uint32_t doff = h[4];
    if (size < 8 || (long long)size > limit || doff < 2 || h[5] != 0 || doff * 4 > size)
        return -1;
    if ((uint64_t)size > (uint64_t)(end - pos)) return -1;       /* partial frame */
    *body = pos + (Py_ssize_t)(doff * 4);
    return pos + (Py_ssize_t)size;
}

/* Whether b[start:stop] is ASCII (symbols are; the texts the C readers
 * take are read only then). */
static int ascii(const unsigned char *b, Py_ssize_t start, Py_ssize_t stop) {
    for (Py_ssize_t i = start; i < stop; i++)
        if (b[i] & 0x80) return 0;
    return 1;
}

/* Field kinds of the header (Part 3 §3.2.1) and properties (§3.2.4) lists, in order. */
enum { K_BOOL, K_UBYTE, K_UINT, K_MSGID, K_BINARY, K_STRING, K_SYMBOL, K_TIMESTAMP };
static const unsigned char HEADER_KINDS[] = {K_BOOL, K_UBYTE, K_UINT, K_BOOL, K_UINT};
static const unsigned char PROPERTIES_KINDS[] = {
    K_MSGID, K_BINARY, K_STRING, K_STRING, K_STRING, K_MSGID, K_SYMBOL, K_SYMBOL,
    K_TIMESTAMP, K_TIMESTAMP, K_STRING, K_UINT, K_STRING};

/* The field at b[q] (q < lend checked by the caller) of kind `kind`, in one of the plain
 * canonical forms below; anything else (32-bit lengths, non-ASCII text, another constructor)
 * returns -1 and the Python reader judges the message. Sets *text and *len to the bytes of a
 * binary/string/symbol. Returns the offset past the field. */
static Py_ssize_t plain_field(const unsigned char *b, Py_ssize_t q, Py_ssize_t lend, int kind,
                              const unsigned char **text, Py_ssize_t *len) {
    unsigned char c = b[q];
    Py_ssize_t width;
    *text = NULL;
    *len = 0;
    if (c == 0x40) return q + 1;                          /* null: any field */
    switch (kind) {
    case K_BOOL:
        if (c == 0x41 || c == 0x42) return q + 1;
        if (c == 0x56) {
            if (lend - q < 2 || b[q + 1] > 1) return -1;
            return q + 2;
        }
        return -1;
    case K_UBYTE:
        width = c == 0x50 ? 1 : -1;
        break;
    case K_UINT:
        width = c == 0x43 ? 0 : c == 0x52 ? 1 : c == 0x70 ? 4 : -1;
        break;
    case K_TIMESTAMP:
        width = c == 0x83 ? 8 : -1;
        break;
    case K_MSGID:
        width = c == 0x44 ? 0 : c == 0x53 ? 1 : c == 0x80 ? 8 : c == 0x98 ? 16 : -1;
        if (width < 0 && (c == 0xA0 || c == 0xA1)) break;  /* binary8 / string8 below */
        if (width < 0) return -1;
        break;
    case K_BINARY:
        if (c != 0xA0) return -1;
        width = -1;
        break;
    case K_STRING:
        if (c != 0xA1) return -1;
        width = -1;
        break;
    case K_SYMBOL:
        if (c != 0xA3) return -1;
        width = -1;
        break;
    default:
        return -1;
    }
    if (width >= 0) {
        if (lend - (q + 1) < width) return -1;
        return q + 1 + width;
    }
    /* binary8 (0xA0), string8 (0xA1), symbol8 (0xA3): one length byte */
    if (c != 0xA0 && c != 0xA1 && c != 0xA3) return -1;
    if (lend - q < 2) return -1;
    Py_ssize_t n = b[q + 1];
    if (n > lend - (q + 2)) return -1;
    if (c != 0xA0 && !ascii(b, q + 2, q + 2 + n)) return -1;  /* text: plain ASCII only */
    *text = b + q + 2;
    *len = n;
    return q + 2 + n;
}

/* A header or properties list at b[v] (v < fend checked by the caller): list0, or list8
 * whose `count` fields (at most nkinds) of the given kinds exactly fill its size. For the
 * properties, *user_id and *to receive those fields' bytes (NULL when absent or null).
 * Returns the offset past the list, or -1 (the Python reader judges it). */
static Py_ssize_t plain_list(const unsigned char *b, Py_ssize_t v, Py_ssize_t fend,
                             const unsigned char *kinds, Py_ssize_t nkinds,
                             const unsigned char **user_id, Py_ssize_t *user_id_len,
                             const unsigned char **to, Py_ssize_t *to_len) {
    if (b[v] == 0x45) return v + 1;                       /* list0 */
    if (b[v] != 0xC0 || fend - v < 3) return -1;          /* list8 only */
    Py_ssize_t size = b[v + 1], count = b[v + 2];
    if (size < 1 || size > fend - (v + 2) || count > nkinds) return -1;
    Py_ssize_t lend = v + 2 + size, q = v + 3;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (q >= lend) return -1;                         /* count and size disagree */
        const unsigned char *text;
        Py_ssize_t len;
        int is_null = b[q] == 0x40;
        q = plain_field(b, q, lend, kinds[i], &text, &len);
        if (q < 0) return -1;
        if (user_id != NULL && i == 1 && !is_null) {
            *user_id = text;
            *user_id_len = len;
        }
        if (to != NULL && i == 2 && !is_null) {
            for (Py_ssize_t j = 0; j < len; j++)
                if (text[j] == 0) return -1;              /* a NUL in `to`: Python refuses */
            *to = text;
            *to_len = len;
        }
    }
    return q == lend ? lend : -1;
}

/* What plain_head() read of a message head: the properties' user-id and `to` (NULL when
 * absent or null), and whether a later section (application-properties .. footer) follows. */
struct head {
    const unsigned char *user_id, *to;
    Py_ssize_t user_id_len, to_len;
    int later;
};

/* The message head (Part 3 §3.2: header, then properties) in b[p:end], read only in the plain
 * forms plain_list() takes, each section described as 0x00 0x53 code, in order, up to the
 * first later section or to `end`. Returns 1 with *h filled when the head is plain; 0 for
 * delivery- or message-annotations, a 0x00 0x80 descriptor, a section out of order, a value
 * cut by `end` or anything unusual (the Python reader decides). */
static int plain_head(const unsigned char *b, Py_ssize_t p, Py_ssize_t end, struct head *h) {
    int next = 0;                                         /* 0: header allowed, 1: properties */
    memset(h, 0, sizeof *h);
    while (p < end) {
        if (end - p < 4 || b[p] != 0x00 || b[p + 1] != 0x53) return 0;
        unsigned char code = b[p + 2];
        if (code >= 0x74 && code <= 0x78) {               /* application-properties .. footer */
            h->later = 1;
            return 1;
        }
        if (code == 0x70 && next == 0) {
            p = plain_list(b, p + 3, end, HEADER_KINDS, 5, NULL, NULL, NULL, NULL);
            next = 1;
        } else if (code == 0x73 && next <= 1) {
            p = plain_list(b, p + 3, end, PROPERTIES_KINDS, 13, &h->user_id, &h->user_id_len,
                           &h->to, &h->to_len);
            next = 2;
        } else {
            return 0;
        }
        if (p < 0) return 0;
    }
    return 1;
}

/* The head of a whole single-frame message in b[p:fend] (plain_head()): 1 when it is plain
 * and its user-id is absent, null or equal to uid[0:uid_len]; 0 otherwise (a user-id proxy
 * violation, or a head only the Python reader judges). */
static int head_ok(const unsigned char *b, Py_ssize_t p, Py_ssize_t fend,
                   const unsigned char *uid, Py_ssize_t uid_len) {
    struct head h;
    if (!plain_head(b, p, fend, &h)) return 0;
    return h.user_id == NULL ||
           (h.user_id_len == uid_len && memcmp(h.user_id, uid, (size_t)uid_len) == 0);
}

/* message_head(buf, pos, end, last) -> (user_id, to, False, complete) or None
 *
 * The message head (header, then properties: Part 3 §3.2) of buf[pos:end], read only in the
 * plain forms plain_list() takes, each section described as 0x00 0x53 code, in order, up to
 * the first later section (application-properties .. footer) or to `end`. Returns what
 * amqp_policy_proxy.amqp.message.read_message_head returns for the same bytes (user-id as
 * bytes, `to` as str, no router annotations, `complete` true at a later section, else
 * `last`); None for anything else (annotations, a 0x00 0x80 descriptor, a list32, a 32-bit
 * length, non-ASCII text, a NUL in `to`, a value cut by `end`; see plain_head()): the Python
 * reader then reads the head, or refuses it. A property test checks that every answer equals
 * Python's. */
static PyObject *message_head(PyObject *Py_UNUSED(self), PyObject *const *args,
                              Py_ssize_t nargs) {
    int last;
    if (flag_last(args, nargs, 4, "message_head(buf, pos, end, last)", &last) < 0) return NULL;
    Py_buffer view;
    Py_ssize_t p, end;
    if (open_window(args, &view, &p, &end) < 0) return NULL;
    struct head h;
    PyObject *result = NULL;
    if (!plain_head((const unsigned char *)view.buf, p, end, &h)) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *uid = h.user_id != NULL
            ? PyBytes_FromStringAndSize((const char *)h.user_id, h.user_id_len)
            : Py_NewRef(Py_None);
        PyObject *address = h.to != NULL
            ? PyUnicode_DecodeASCII((const char *)h.to, h.to_len, NULL) : Py_NewRef(Py_None);
        if (uid != NULL && address != NULL)
            result = PyTuple_Pack(4, uid, address, Py_False,
                                  h.later || last ? Py_True : Py_False);
        Py_XDECREF(uid);
        Py_XDECREF(address);
    }
    PyBuffer_Release(&view);
    return result;
}

/* The performative `code` (0x00 0x53 code) whose list8/list32 fills b[pos:end] exactly, as
 * amqp_policy_proxy.amqp.handshake reads the handshake's performatives: 1 with *first (its
 * first field) and *count set, else 0 (a list0, a list that does not fill the body, ...). */
static int described_list(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, int code,
                          Py_ssize_t *first, uint32_t *count) {
    if (end - pos < 6 || b[pos] != 0x00 || b[pos + 1] != 0x53 || b[pos + 2] != code) return 0;
    Py_ssize_t p = pos + 3;
    if (b[p] == 0xC0) {
        if (b[p + 1] < 1 || p + 2 + (Py_ssize_t)b[p + 1] != end) return 0;
        *count = b[p + 2];
        *first = p + 3;
        return 1;
    }
    if (b[p] == 0xD0) {
        if (end - p < 9) return 0;
        uint32_t size = be32(b + p + 1);
        if (size < 4 || (uint64_t)size != (uint64_t)(end - (p + 5))) return 0;
        *count = be32(b + p + 5);
        *first = p + 9;
        return 1;
    }
    return 0;
}

/* A sized value with constructors `short_code` (one-byte length) or `long_code` (four-byte
 * length) at b[p] (p < end checked here): the offset past it with *start set, else -1. */
static Py_ssize_t sized(const unsigned char *b, Py_ssize_t p, Py_ssize_t end, int short_code,
                        int long_code, Py_ssize_t *start) {
    if (p >= end) return -1;
    uint32_t n;  /* compared as unsigned before the cast: with a 32-bit Py_ssize_t (i386,
                  * armv7) a length of 0x80000000 or more would turn negative */
    if (b[p] == short_code) {
        if (end - p < 2) return -1;
        *start = p + 2;
        n = b[p + 1];
    } else if (b[p] == long_code) {
        if (end - p < 5) return -1;
        *start = p + 5;
        n = be32(b + p + 1);
    } else {
        return -1;
    }
    return (uint64_t)n > (uint64_t)(end - *start) ? -1 : *start + (Py_ssize_t)n;
}

/* sasl_init(buf, pos, end) -> (mechanism, initial_response) or None
 *
 * What amqp_policy_proxy.amqp.handshake.read_sasl_init answers for the sasl-init (Part 5
 * §5.3.3.2) whose frame body is buf[pos:end], read in C for its plain encoding: 0x00 0x53 0x41,
 * a list8/list32 filling the body with 1 to 3 fields: mechanism a sym8/sym32, initial-response
 * null or a vbin8/vbin32, hostname null or an ASCII str8/str32. None for anything else: the
 * Python reader then reads it (a hostname in other UTF-8 included), or refuses it. A property
 * test checks that every answer equals Python's. The initial response may hold a password:
 * it is only copied into the result. */
static PyObject *sasl_init(PyObject *Py_UNUSED(self), PyObject *const *args,
                           Py_ssize_t nargs) {
    if (arity(nargs, 3, "sasl_init(buf, pos, end)") < 0) return NULL;
    Py_buffer view;
    Py_ssize_t pos, end, p, start, rstart = -1, rstop = -1;
    if (open_window(args, &view, &pos, &end) < 0) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    uint32_t count;
    PyObject *result = NULL;
    if (!described_list(b, pos, end, 0x41, &p, &count) || count < 1 || count > 3) goto no;
    Py_ssize_t mstart, mstop = sized(b, p, end, 0xA3, 0xB3, &mstart);
    if (mstop < 0 || !ascii(b, mstart, mstop)) goto no;
    p = mstop;
    if (count >= 2) {
        if (p >= end) goto no;
        if (b[p] == 0x40) {
            p += 1;
        } else {
            rstop = sized(b, p, end, 0xA0, 0xB0, &rstart);
            if (rstop < 0) goto no;
            p = rstop;
        }
    }
    if (count == 3) {
        if (p >= end) goto no;
        if (b[p] == 0x40) {
            p += 1;
        } else {
            Py_ssize_t hstop = sized(b, p, end, 0xA1, 0xB1, &start);
            if (hstop < 0 || !ascii(b, start, hstop)) goto no;
            p = hstop;
        }
    }
    if (p != end) goto no;
    {
        PyObject *mechanism = PyUnicode_DecodeASCII((const char *)b + mstart, mstop - mstart,
                                                    NULL);
        PyObject *response = rstart < 0 ? Py_NewRef(Py_None)
            : PyBytes_FromStringAndSize((const char *)b + rstart, rstop - rstart);
        if (mechanism != NULL && response != NULL)
            result = PyTuple_Pack(2, mechanism, response);
        Py_XDECREF(mechanism);
        Py_XDECREF(response);
    }
    PyBuffer_Release(&view);
    return result;
no:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* sasl_mechanisms(buf, pos, end) -> True or None
 *
 * True where amqp_policy_proxy.amqp.handshake.is_sasl_mechanisms says True for the SASL frame
 * body buf[pos:end], read in C for the forms routers send: 0x00 0x53 0x40, a list8/list32
 * filling the body with one field, a sym8/sym32 or an array8 of sym8 (at least one), every
 * name ASCII. None for anything else: the Python reader decides. Property-tested. */
static PyObject *sasl_mechanisms(PyObject *Py_UNUSED(self), PyObject *const *args,
                                 Py_ssize_t nargs) {
    if (arity(nargs, 3, "sasl_mechanisms(buf, pos, end)") < 0) return NULL;
    Py_buffer view;
    Py_ssize_t pos, end, p, start;
    if (open_window(args, &view, &pos, &end) < 0) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    uint32_t count;
    int plain = 0;
    if (described_list(b, pos, end, 0x40, &p, &count) && count == 1 && p < end) {
        if (b[p] == 0xA3 || b[p] == 0xB3) {
            Py_ssize_t stop = sized(b, p, end, 0xA3, 0xB3, &start);
            plain = stop == end && ascii(b, start, stop);
        } else if (b[p] == 0xE0 || b[p] == 0xF0) {        /* array8 / array32 */
            uint64_t n = 0;
            Py_ssize_t q = -1;
            if (b[p] == 0xE0 && end - p >= 4 && p + 2 + (Py_ssize_t)b[p + 1] == end) {
                n = b[p + 2];
                q = p + 3;
            } else if (b[p] == 0xF0 && end - p >= 10
                       && (uint64_t)be32(b + p + 1) == (uint64_t)(end - (p + 5))) {
                n = be32(b + p + 5);
                q = p + 9;
            }
            int element = q < 0 ? 0 : b[q++];
            plain = n > 0 && (element == 0xA3 || element == 0xB3);
            for (uint64_t i = 0; plain && i < n; i++) {    /* sym8 / sym32: length, name */
                Py_ssize_t at;
                uint32_t len;                             /* compared before any cast */
                if (element == 0xA3 && q < end) {
                    at = q + 1;
                    len = b[q];
                } else if (element == 0xB3 && end - q >= 4) {
                    at = q + 4;
                    len = be32(b + q);
                } else {
                    plain = 0;
                    break;
                }
                if ((uint64_t)len > (uint64_t)(end - at)) {
                    plain = 0;
                    break;
                }
                plain = ascii(b, at, at + (Py_ssize_t)len);
                q = at + (Py_ssize_t)len;
            }
            plain = plain && q == end;
        }
    }
    PyBuffer_Release(&view);
    if (plain) Py_RETURN_TRUE;
    Py_RETURN_NONE;
}

/* The offset past the AMQP value at b[p] (p < end checked here), for the values an Open
 * carries in their plain forms: a fixed-width value (constructors 0x40..0x9F) or a
 * variable-width or compound one (0xA0..0xFF, one- or four-byte size). -1 for anything else
 * (a described value, an invalid constructor, a value cut by `end`): the Python reader
 * decides. */
static Py_ssize_t skip_plain(const unsigned char *b, Py_ssize_t p, Py_ssize_t end) {
    static const unsigned char FIXED[] = {1, 2, 3, 5, 9, 17};   /* widths 0x4 .. 0x9 */
    if (p >= end) return -1;
    unsigned width = b[p] >> 4;
    Py_ssize_t next;
    if (width >= 0x4 && width <= 0x9) {
        next = p + FIXED[width - 0x4];
    } else if (width == 0xA || width == 0xC || width == 0xE) {
        if (end - p < 2) return -1;
        next = p + 2 + b[p + 1];
    } else if (width == 0xB || width == 0xD || width == 0xF) {
        if (end - p < 5) return -1;
        uint32_t n = be32(b + p + 1);
        if ((uint64_t)n > (uint64_t)(end - (p + 5))) return -1;
        next = p + 5 + (Py_ssize_t)n;
    } else {
        return -1;
    }
    return next > end ? -1 : next;
}

/* A str8/str32-utf8 (0xA1/0xB1) at b[p] filling b[p:stop] exactly, or null (0x40) when
 * `nullable`: a new reference to the text (Py_None for null), NULL without an exception for
 * anything else (not UTF-8 included), NULL with one only when memory ran out. */
static PyObject *open_string(const unsigned char *b, Py_ssize_t p, Py_ssize_t stop,
                             int nullable) {
    Py_ssize_t start;
    if (b[p] == 0x40 && nullable) return stop == p + 1 ? Py_NewRef(Py_None) : NULL;
    if (b[p] == 0xA1) start = p + 2;
    else if (b[p] == 0xB1) start = p + 5;
    else return NULL;
    PyObject *text = PyUnicode_DecodeUTF8((const char *)b + start, stop - start, "strict");
    if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();
    return text;
}

/* A uint (0x43, 0x52, 0x70) or null at b[p] filling b[p:stop]: 1 with *out set (-1 for
 * null), else 0. */
static int open_uint(const unsigned char *b, Py_ssize_t p, Py_ssize_t stop, int64_t *out) {
    return read_uint(b, p, stop, 1, out) == stop;
}

/* open_head(body, strict) -> (container_id, hostname, max_frame_size, channel_max,
 *                             (offsets, list_end)) or None
 *
 * What amqp_policy_proxy.amqp.handshake.read_open_head(body, strict=strict) answers for the
 * Open frame body `body` (Part 2 §2.7.1), read in C for the plain encoding: 0x00 0x53 0x10, a
 * list8/list32 that fills the body with 1 to 10 fields, each a value skip_plain() walks;
 * container-id a str8/str32-utf8, hostname one or null, max-frame-size a uint or null,
 * channel-max a ushort (0x60) or null; with `strict`, idle-time-out a uint or null, every
 * later field null and no NUL in the two strings. None for anything else (a described field,
 * text that is not UTF-8, ...): the Python reader then reads the body, or refuses it. A
 * property test checks that every answer equals Python's. */
static PyObject *open_head(PyObject *Py_UNUSED(self), PyObject *const *args,
                           Py_ssize_t nargs) {
    int strict;
    if (flag_last(args, nargs, 2, "open_head(body, strict)", &strict) < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    Py_ssize_t end = view.len, p, lend, offsets[11];
    uint32_t count = 0;
    PyObject *result = NULL, *container_id = NULL, *hostname = NULL;
    int64_t mfs = -1, cmax = -1, idle;
    if (!described_list(b, 0, end, 0x10, &p, &count) || count < 1 || count > 10) goto plain_no;
    lend = end;
    for (uint32_t i = 0; i < count; i++) {
        offsets[i] = p;
        p = skip_plain(b, p, lend);
        if (p < 0) goto plain_no;
    }
    if (p != lend) goto plain_no;
    offsets[count] = lend;
    container_id = open_string(b, offsets[0], offsets[1], 0);
    if (container_id == NULL) goto fail_or_no;
    if (count > 1) {
        hostname = open_string(b, offsets[1], offsets[2], 1);
        if (hostname == NULL) goto fail_or_no;
    } else {
        hostname = Py_NewRef(Py_None);
    }
    if (count > 2 && !open_uint(b, offsets[2], offsets[3], &mfs)) goto plain_no;
    if (count > 3) {
        Py_ssize_t q = offsets[3];
        if (b[q] == 0x40 && offsets[4] == q + 1) cmax = -1;
        else if (b[q] == 0x60 && offsets[4] == q + 3) cmax = ((int64_t)b[q + 1] << 8) | b[q + 2];
        else goto plain_no;
    }
    if (strict) {
        if (count > 4 && !open_uint(b, offsets[4], offsets[5], &idle)) goto plain_no;
        for (uint32_t i = 5; i < count; i++)
            if (b[offsets[i]] != 0x40) goto plain_no;
        Py_ssize_t nul = PyUnicode_FindChar(container_id, 0, 0, PY_SSIZE_T_MAX, 1);
        if (nul == -2) goto fail_or_no;
        if (nul >= 0) goto plain_no;
        if (hostname != Py_None) {
            nul = PyUnicode_FindChar(hostname, 0, 0, PY_SSIZE_T_MAX, 1);
            if (nul == -2) goto fail_or_no;
            if (nul >= 0) goto plain_no;
        }
    }
    {
        PyObject *list = PyList_New((Py_ssize_t)count);
        if (list == NULL) goto fail_or_no;
        for (uint32_t i = 0; i < count; i++) {
            PyObject *n = PyLong_FromSsize_t(offsets[i]);
            if (n == NULL) {
                Py_DECREF(list);
                goto fail_or_no;
            }
            PyList_SET_ITEM(list, i, n);
        }
        PyObject *mfs_obj = mfs < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(mfs);
        PyObject *cmax_obj = cmax < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(cmax);
        if (mfs_obj != NULL && cmax_obj != NULL)
            result = Py_BuildValue("(OOOO(Nn))", container_id, hostname, mfs_obj, cmax_obj,
                                   list, lend);
        else
            Py_DECREF(list);
        Py_XDECREF(mfs_obj);
        Py_XDECREF(cmax_obj);
    }
    goto done;
fail_or_no:
    if (PyErr_Occurred()) goto done;                      /* out of memory: raise */
plain_no:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(container_id);
    Py_XDECREF(hostname);
    PyBuffer_Release(&view);
    return result;
}

/* What a walker's rule says of one non-empty frame: stop before it, pass it, or pass it and
 * count it as a Transfer. */
enum { STOP, PASS, PASS_TRANSFER };
typedef int (*frame_rule)(const void *rule_args, const unsigned char *b, Py_ssize_t pos,
                          Py_ssize_t body, Py_ssize_t fend);

/* The walk both scanners make: the whole frames of the window (args: buf, pos, end) within
 * the header rule and `limit`, heartbeats always passed, every other frame as `rule` says, up
 * to the first one it stops at. Sets the offset reached and the Transfers passed; returns 0,
 * or -1 with an exception set. */
static inline int walk(PyObject *const *args, long long limit, frame_rule rule,
                       const void *rule_args, Py_ssize_t *reached, Py_ssize_t *transfers) {
    Py_buffer view;
    Py_ssize_t pos, end, passed = 0;
    if (open_window(args, &view, &pos, &end) < 0) return -1;
    const unsigned char *b = (const unsigned char *)view.buf;
    while (end - pos >= 8) {
        Py_ssize_t body, fend = whole_frame(b, pos, end, limit, &body);
        if (fend < 0) break;
        if (body != fend) {                                      /* not a heartbeat */
            int verdict = rule(rule_args, b, pos, body, fend);
            if (verdict == STOP) break;
            passed += verdict == PASS_TRANSFER;
        }
        pos = fend;
    }
    PyBuffer_Release(&view);
    *reached = pos;
    *transfers = passed;
    return 0;
}

/* The link's delivery in progress, as scan() carries it across frames: `bytes` of payload
 * so far (-1: between deliveries), its first frame's delivery-id (-1: null) and whether any
 * frame of it was settled. */
struct delivery {
    long long bytes;
    int64_t id;
    int settled;
};

/* scan()'s link, limits and the delivery it carries. */
struct link_rule {
    int usable;
    long long channel, want, max_size;
    const unsigned char *uid;
    Py_ssize_t uid_len;
    struct delivery *delivery;
};

/* scan()'s rule: a Transfer on the link, plain, whose delivery stays within max_size: a whole
 * delivery (with a user-id, only one whose head head_ok() passes), the first frame of a
 * multi-frame delivery (not with a user-id: its head may not be whole), or a later frame of
 * the delivery in progress (nothing to check but its size). */
static int link_transfer(const void *rule_args, const unsigned char *b, Py_ssize_t pos,
                         Py_ssize_t body, Py_ssize_t fend) {
    const struct link_rule *r = rule_args;
    if (!r->usable || (((uint32_t)b[pos + 6] << 8) | b[pos + 7]) != (uint32_t)r->channel)
        return STOP;
    if (fend - body <= 3 || b[body] != 0x00 || b[body + 1] != 0x53 || b[body + 2] != 0x14)
        return STOP;
    struct transfer t;
    if (!plain_transfer(b, body, fend, &t) || t.handle != (int64_t)r->want) return STOP;
    struct delivery *d = r->delivery;
    long long total = (long long)(fend - t.payload);
    if (d->bytes < 0 && !t.more) {                        /* a whole delivery: most frames */
        if (r->max_size >= 0 && total > r->max_size) return STOP;
        if (r->uid != NULL && !head_ok(b, t.payload, fend, r->uid, r->uid_len)) return STOP;
        return PASS_TRANSFER;
    }
    if (d->bytes >= 0) total += d->bytes;                 /* more of the delivery under way */
    if (r->max_size >= 0 && total > r->max_size) return STOP;
    if (d->bytes >= 0) {
        d->settled |= t.settled;
    } else {                                              /* a multi-frame delivery starts */
        if (r->uid != NULL) return STOP;
        d->id = t.delivery_id;
        d->settled = t.settled;
    }
    d->bytes = t.more ? total : -1;
    return PASS_TRANSFER;
}

static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *const *args,
                      Py_ssize_t nargs) {
    if (arity(nargs, 9, "scan(buf, pos, end, limit, channel, handle, max_size, user_id, "
                        "delivery)") < 0)
        return NULL;
    struct delivery d = {-1, -1, 0};
    struct link_rule r = {0};
    r.delivery = &d;
    if (args[7] != Py_None) {
        if (!PyBytes_Check(args[7])) {
            PyErr_SetString(PyExc_TypeError, "user_id must be bytes or None");
            return NULL;
        }
        r.uid = (const unsigned char *)PyBytes_AS_STRING(args[7]);
        r.uid_len = PyBytes_GET_SIZE(args[7]);
    }
    if (args[8] != Py_None) {
        PyObject *id;
        int settled;
        if (!PyTuple_Check(args[8])) {
            PyErr_SetString(PyExc_TypeError, "delivery must be a tuple or None");
            return NULL;
        }
        if (!PyArg_ParseTuple(args[8], "LOp", &d.bytes, &id, &settled)) return NULL;
        d.id = id == Py_None ? -1 : PyLong_AsLongLong(id);
        d.settled = settled;
        if (!PyErr_Occurred() && (d.bytes < 0 || d.id < -1 || d.id > 0xFFFFFFFFLL))
            PyErr_SetString(PyExc_ValueError, "delivery out of range");
    }
    long long limit = PyLong_AsLongLong(args[3]);
    r.channel = PyLong_AsLongLong(args[4]);
    r.want = PyLong_AsLongLong(args[5]);
    r.max_size = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    r.usable = r.channel >= 0 && r.channel <= 0xFFFF && r.want >= 0 && r.want <= 0xFFFFFFFFLL;
    Py_ssize_t reached, transfers;
    if (walk(args, limit, link_transfer, &r, &reached, &transfers) < 0) return NULL;
    if (d.bytes < 0) return Py_BuildValue("(nnO)", reached, transfers, Py_None);
    PyObject *id = d.id < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(d.id);
    if (id == NULL) return NULL;
    return Py_BuildValue("(nn(LNO))", reached, transfers, d.bytes, id,
                         d.settled ? Py_True : Py_False);
}

/* scan_router(buf, pos, end, limit) -> (pos, transfers)
 *
 * The router side's run: walks the consecutive frames of buf[pos:end] while each one is an
 * empty AMQP frame (heartbeat), a Transfer or a Disposition (descriptor 0x00 0x53 0x14 or
 * 0x15), on any channel, its header within the rule of
 * amqp_policy_proxy.amqp.framing.frame_header_ok (SIZE 8..limit, DOFF >= 2 and inside the
 * frame, TYPE 0) and the frame wholly inside buf[:end]. It stops at the first other frame
 * (a Flow, an Attach, a descriptor in another form, a bad header, a partial frame) and
 * returns the offset reached and the number of Transfers passed. The caller uses it only
 * while no router Transfer or Disposition needs a look (no topic-filtered receiver, no
 * renumbered session, no per-session count): the frames it passes are relayed as they came.
 * Reads are bounded as in scan(). */
static int router_run(const void *rule_args, const unsigned char *b, Py_ssize_t pos,
                      Py_ssize_t body, Py_ssize_t fend) {
    (void)rule_args;
    (void)pos;
    if (fend - body < 3 || b[body] != 0x00 || b[body + 1] != 0x53) return STOP;
    if (b[body + 2] == 0x14) return PASS_TRANSFER;
    return b[body + 2] == 0x15 ? PASS : STOP;
}

static PyObject *scan_router(PyObject *Py_UNUSED(self), PyObject *const *args,
                             Py_ssize_t nargs) {
    if (arity(nargs, 4, "scan_router(buf, pos, end, limit)") < 0) return NULL;
    long long limit = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t reached, transfers;
    if (walk(args, limit, router_run, NULL, &reached, &transfers) < 0) return NULL;
    return Py_BuildValue("(nn)", reached, transfers);
}

/* An entry of the method table: `name`, taking its arguments as a C array (METH_FASTCALL), with
 * `doc` as its docstring (each names the Python statement or reader it answers for). */
#define FASTCALL(name, doc) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL, doc}

static PyMethodDef methods[] = {
    FASTCALL(scan, "scan(buf, pos, end, limit, channel, handle, max_size, user_id, delivery) -> "
                   "(pos, transfers, delivery): scan_py (tests/support/scan_twins.py) in C."),
    FASTCALL(scan_router, "scan_router(buf, pos, end, limit) -> (pos, transfers): "
                          "scan_router_py (tests/support/scan_twins.py) in C."),
    FASTCALL(transfer_fields, "transfer_fields(buf, pos, end): the plain Transfers of "
                              "amqp_policy_proxy.amqp.transfer.read_transfer_fields, else None."),
    FASTCALL(open_head, "open_head(body, strict): the plain Opens of "
                        "amqp_policy_proxy.amqp.handshake.read_open_head, else None."),
    FASTCALL(sasl_init, "sasl_init(buf, pos, end): the plain sasl-inits of "
                        "amqp_policy_proxy.amqp.handshake.read_sasl_init, else None."),
    FASTCALL(sasl_mechanisms, "sasl_mechanisms(buf, pos, end): True for the plain ones of "
                              "amqp_policy_proxy.amqp.handshake.is_sasl_mechanisms, else None."),
    FASTCALL(message_head, "message_head(buf, pos, end, last): the plain heads of "
                           "amqp_policy_proxy.amqp.message.read_message_head, else None."),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_relayscan",
    "C fast path of the client relay loop (see amqp_policy_proxy.amqp.accel).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__relayscan(void) {
    PyObject *transfer = PyImport_ImportModule("amqp_policy_proxy.amqp.transfer");
    if (transfer == NULL) return NULL;
    PyObject *type = PyObject_GetAttrString(transfer, "TransferFields");
    Py_DECREF(transfer);
    if (type == NULL) return NULL;
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        Py_DECREF(type);
        PyErr_SetString(PyExc_TypeError, "amqp_policy_proxy.amqp.transfer.TransferFields "
                                         "is not a tuple type");
        return NULL;
    }
    Py_XSETREF(fields_type, (PyTypeObject *)type); /* kept for the process's life */
    return PyModule_Create(&module);
}
