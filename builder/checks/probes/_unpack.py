# Prepended (after _report.py) to the gpucode probe: the two codecs fatbin entries are compressed
# with, in pure Python (the image's interpreter has neither; CPython's compression.zstd is 3.14+).
# Fatbin entry flag 0x2000 is an LZ4 *block* (no frame: nvcc 12.x's default, NCCL 2.30.7's
# cubins, CUDA 13's --compress-mode=speed); 0x8000 is a ZSTD *frame* (RFC 8878: CUDA 13's default,
# size and balance modes). Both decoders stop with UnpackError (a ValueError) on any input that does
# not decode to exactly the size the entry header states, and never write past ``limit`` bytes.


class UnpackError(ValueError):
    pass


def lz4_block(src, size, limit, stop=None):
    """The ``size`` bytes an LZ4 block decodes to (LZ4 Block Format: token, literals, 2-byte
    offset, match of at least 4; the last sequence has literals only); only the first ``stop``
    bytes when it is given (a PTX text's header)."""
    if size > limit:
        raise UnpackError(f"states {size} bytes, over the {limit}-byte cap")
    out, pos, end = bytearray(), 0, len(src)
    while pos < end:
        token = src[pos]
        pos += 1
        lit = token >> 4
        if lit == 15:
            while True:
                if pos >= end:
                    raise UnpackError("LZ4 literal length runs past the input")
                b = src[pos]
                pos += 1
                lit += b
                if b != 255:
                    break
        if pos + lit > end or len(out) + lit > size:
            raise UnpackError("LZ4 literals run past the input or the stated size")
        out += src[pos : pos + lit]
        pos += lit
        if pos >= end:
            break  # the last sequence: literals only
        if pos + 2 > end:
            raise UnpackError("LZ4 offset runs past the input")
        offset = src[pos] | (src[pos + 1] << 8)
        pos += 2
        match = (token & 15) + 4
        if match == 19:
            while True:
                if pos >= end:
                    raise UnpackError("LZ4 match length runs past the input")
                b = src[pos]
                pos += 1
                match += b
                if b != 255:
                    break
        if offset == 0 or offset > len(out) or len(out) + match > size:
            raise UnpackError(f"LZ4 match (offset {offset}, length {match}) outside the output")
        _copy_match(out, offset, match)
        if stop is not None and len(out) >= stop:
            return bytes(out[:stop])
    if len(out) != size:
        raise UnpackError(f"decodes to {len(out)} bytes, the header states {size}")
    return bytes(out)


def lz4_walk(src, size):
    """Check that an LZ4 block decodes to exactly ``size`` bytes without writing them: every check
    ``lz4_block`` makes (lengths, offsets, the stated size) on the whole block, so a prefix judged
    from its first bytes is never taken from a block whose rest cannot be decoded."""
    n, pos, end = 0, 0, len(src)
    while pos < end:
        token = src[pos]
        pos += 1
        lit = token >> 4
        if lit == 15:
            while True:
                if pos >= end:
                    raise UnpackError("LZ4 literal length runs past the input")
                b = src[pos]
                pos += 1
                lit += b
                if b != 255:
                    break
        if pos + lit > end or n + lit > size:
            raise UnpackError("LZ4 literals run past the input or the stated size")
        n += lit
        pos += lit
        if pos >= end:
            break
        if pos + 2 > end:
            raise UnpackError("LZ4 offset runs past the input")
        offset = src[pos] | (src[pos + 1] << 8)
        pos += 2
        match = (token & 15) + 4
        if match == 19:
            while True:
                if pos >= end:
                    raise UnpackError("LZ4 match length runs past the input")
                b = src[pos]
                pos += 1
                match += b
                if b != 255:
                    break
        if offset == 0 or offset > n or n + match > size:
            raise UnpackError(f"LZ4 match (offset {offset}, length {match}) outside the output")
        n += match
    if n != size:
        raise UnpackError(f"decodes to {n} bytes, the header states {size}")


def _copy_match(out, offset, length):
    start = len(out) - offset
    if length <= offset:
        out += out[start : start + length]
        return
    chunk = out[start:]  # an overlapping match repeats the last ``offset`` bytes
    whole, rest = divmod(length, offset)
    out += chunk * whole + chunk[:rest]


# --- ZSTD (RFC 8878) ---------------------------------------------------------------------------
ZSTD_MAGIC = 0xFD2FB528
_LL_BASE = (*range(16), 16, 18, 20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
            16384, 32768, 65536)  # fmt: skip
_LL_BITS = (0,) * 16 + (1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)
_ML_BASE = (*range(3, 35), 35, 37, 39, 41, 43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051, 4099,
            8195, 16387, 32771, 65539)  # fmt: skip
_ML_BITS = (0,) * 32 + (1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)
_LL_DEFAULT = (4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1,
               -1, -1, -1, -1)  # fmt: skip
_ML_DEFAULT = (1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
               1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1)  # fmt: skip
_OF_DEFAULT = (1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1)


class _Back:
    """A backward bit stream (RFC 8878 4.1): read from the end, the last byte's highest set bit is
    the padding marker; reads past the start give zeros (and overflowed() says so)."""

    def __init__(self, data):
        if not data or data[-1] == 0:
            raise UnpackError("ZSTD bit stream without its end marker")
        self.data = bytes(data) + b"\0" * 8
        self.pos = (len(data) - 1) * 8 + data[-1].bit_length() - 1  # bits left to read

    def read(self, n):
        if n == 0:
            return 0
        self.pos -= n
        p = self.pos
        if p < 0:
            value = int.from_bytes(self.data[0:8], "little") << -p
            return value & ((1 << n) - 1)
        return (int.from_bytes(self.data[p >> 3 : (p >> 3) + 8], "little") >> (p & 7)) & ((1 << n) - 1)

    def peek(self, n):
        p = self.pos - n
        if p < 0:
            return (int.from_bytes(self.data[0:8], "little") << -p) & ((1 << n) - 1)
        return (int.from_bytes(self.data[p >> 3 : (p >> 3) + 8], "little") >> (p & 7)) & ((1 << n) - 1)

    def overflowed(self):
        return self.pos < 0


def _fse_table(counts, log):
    """The decoding table of an FSE distribution: [(symbol, bits, base)] (RFC 8878 4.1.1)."""
    size = 1 << log
    symbols = [0] * size
    high = size - 1
    for s, c in enumerate(counts):
        if c == -1:
            symbols[high] = s
            high -= 1
    step, mask, pos = (size >> 1) + (size >> 3) + 3, size - 1, 0
    for s, c in enumerate(counts):
        for _ in range(max(c, 0)):
            symbols[pos] = s
            pos = (pos + step) & mask
            while pos > high:
                pos = (pos + step) & mask
    if pos != 0:
        raise UnpackError("ZSTD FSE distribution does not fill its table")
    following = [1 if c == -1 else c for c in counts]
    table = []
    for s in symbols:
        n = following[s]
        following[s] += 1
        bits = log - (n.bit_length() - 1)
        table.append((s, bits, (n << bits) - size))
    return table


def _fse_counts(data, pos, max_log, max_symbol):
    """(counts, accuracy log, next position) of an FSE table description (RFC 8878 4.1.1)."""
    bitpos = pos * 8
    buf = bytes(data) + b"\0" * 8

    def bits(n):
        nonlocal bitpos
        v = (int.from_bytes(buf[bitpos >> 3 : (bitpos >> 3) + 8], "little") >> (bitpos & 7)) & ((1 << n) - 1)
        bitpos += n
        return v

    log = bits(4) + 5
    if log > max_log:
        raise UnpackError(f"ZSTD FSE accuracy log {log} over {max_log}")
    remaining = (1 << log) + 1
    counts: list = []
    while remaining > 1:
        if len(counts) > max_symbol:
            raise UnpackError("ZSTD FSE table has too many symbols")
        width = remaining.bit_length()
        low = (1 << width) - 1 - remaining  # values below ``low`` take width-1 bits
        v = bits(width - 1)
        if v >= low:
            v |= bits(1) << (width - 1)
            if v >= (1 << (width - 1)):
                v -= low
        count = v - 1
        remaining -= abs(count)
        counts.append(count)
        if count == 0:
            while True:
                repeat = bits(2)
                counts += [0] * repeat
                if repeat != 3:
                    break
    if remaining != 1 or len(counts) > max_symbol + 1:
        raise UnpackError("ZSTD FSE table description is corrupt")
    end = (bitpos + 7) >> 3
    if end > len(data):
        raise UnpackError("ZSTD FSE table runs past its block")
    return counts, log, end


def _huffman(data, pos):
    """(table, max bits, next position) of a Huffman tree description (RFC 8878 4.2.1)."""
    head = data[pos]
    pos += 1
    if head >= 128:
        n = head - 127
        raw = data[pos : pos + (n + 1) // 2]
        weights = [(raw[i // 2] >> (0 if i % 2 else 4)) & 15 for i in range(n)]
        pos += (n + 1) // 2
    else:
        counts, log, start = _fse_counts(data[: pos + head], pos, 6, 255)
        table = _fse_table(counts, log)
        stream = _Back(data[start : pos + head])
        s1, s2 = stream.read(log), stream.read(log)
        weights = []
        while True:  # two interleaved states, until the stream runs out
            sym, nb, base = table[s1]
            weights.append(sym)
            s1 = base + stream.read(nb)
            if stream.overflowed():
                weights.append(table[s2][0])
                break
            sym, nb, base = table[s2]
            weights.append(sym)
            s2 = base + stream.read(nb)
            if stream.overflowed():
                weights.append(table[s1][0])
                break
            if len(weights) > 255:
                raise UnpackError("ZSTD Huffman weights overflow")
        pos += head
    total = sum(1 << (w - 1) for w in weights if w)
    if not total:
        raise UnpackError("ZSTD Huffman tree has no weight")
    max_bits = total.bit_length()
    rest = (1 << max_bits) - total
    if rest & (rest - 1):
        raise UnpackError("ZSTD Huffman weights do not complete a tree")
    weights.append(rest.bit_length())
    if max_bits > 11:
        raise UnpackError(f"ZSTD Huffman code of {max_bits} bits")
    table = [None] * (1 << max_bits)
    starts, at = {}, 0
    for w in range(1, max_bits + 1):
        starts[w] = at
        at += sum(1 for x in weights if x == w) << (w - 1)
    for sym, w in enumerate(weights):
        if w:
            n = 1 << (w - 1)
            table[starts[w] : starts[w] + n] = [(sym, max_bits + 1 - w)] * n
            starts[w] += n
    return table, max_bits, pos


def _huff_stream(data, table, max_bits, count, out):
    stream = _Back(data)
    for _ in range(count):
        sym, nb = table[stream.peek(max_bits)]
        out.append(sym)
        stream.pos -= nb
    if stream.pos != 0:
        raise UnpackError("ZSTD Huffman stream does not end where its literals do")


def _literals(data, pos, state):
    """(literals, next position) of a compressed block's literals section (RFC 8878 3.1.1.3.1)."""
    b0 = data[pos]
    kind, fmt = b0 & 3, (b0 >> 2) & 3
    if kind < 2:
        if fmt in (0, 2):
            size, pos = b0 >> 3, pos + 1
        elif fmt == 1:
            size, pos = (b0 >> 4) | (data[pos + 1] << 4), pos + 2
        else:
            size, pos = (b0 >> 4) | (data[pos + 1] << 4) | (data[pos + 2] << 12), pos + 3
        if kind == 0:
            if pos + size > len(data):
                raise UnpackError("ZSTD raw literals run past the block")
            return bytes(data[pos : pos + size]), pos + size
        return bytes([data[pos]]) * size, pos + 1
    width, head = {0: (10, 3), 1: (10, 3), 2: (14, 4), 3: (18, 5)}[fmt]
    value = int.from_bytes(data[pos : pos + head], "little") >> 4
    regen, comp = value & ((1 << width) - 1), (value >> width) & ((1 << width) - 1)
    start, end = pos + head, pos + head + comp
    if end > len(data):
        raise UnpackError("ZSTD compressed literals run past the block")
    if kind == 2:
        state["huff"] = _huffman(data[:end], start)
        start = state["huff"][2]
    elif state.get("huff") is None:
        raise UnpackError("ZSTD treeless literals with no earlier tree")
    table, max_bits, _ = state["huff"]
    out = bytearray()
    if fmt == 0:
        _huff_stream(data[start:end], table, max_bits, regen, out)
    else:
        s1, s2 = data[start] | data[start + 1] << 8, data[start + 2] | data[start + 3] << 8
        s3 = data[start + 4] | data[start + 5] << 8
        each, at = (regen + 3) // 4, start + 6
        bounds = [(at, at + s1), (at + s1, at + s1 + s2), (at + s1 + s2, at + s1 + s2 + s3)]
        bounds.append((at + s1 + s2 + s3, end))
        for i, (a, b) in enumerate(bounds):
            if b > end or a > b:
                raise UnpackError("ZSTD Huffman streams run past the literals")
            _huff_stream(data[a:b], table, max_bits, each if i < 3 else regen - 3 * each, out)
    return bytes(out), end


_DEFAULTS = {"ll": (_LL_DEFAULT, 6), "of": (_OF_DEFAULT, 5), "ml": (_ML_DEFAULT, 6)}
_MAX = {"ll": (9, 35), "of": (8, 31), "ml": (9, 52)}


def _seq_table(data, pos, mode, name, state):
    if mode == 0:
        counts, log = _DEFAULTS[name]
        state[name] = _fse_table(counts, log), log
    elif mode == 1:
        sym = data[pos]
        state[name], pos = ([(sym, 0, 0)], 0), pos + 1
    elif mode == 2:
        counts, log, pos = _fse_counts(data, pos, *_MAX[name])
        state[name] = _fse_table(counts, log), log
    elif state.get(name) is None:
        raise UnpackError("ZSTD repeat table with no earlier table")
    return pos


def _sequences(data, pos, literals, out, state, limit):
    """Decode and run the sequences section (RFC 8878 3.1.1.3.2) onto ``out``."""
    n = data[pos]
    if n == 0:
        out += literals
        return
    if n < 128:
        pos += 1
    elif n < 255:
        n, pos = ((n - 128) << 8) + data[pos + 1], pos + 2
    else:
        n, pos = data[pos + 1] + (data[pos + 2] << 8) + 0x7F00, pos + 3
    modes = data[pos]
    pos += 1
    pos = _seq_table(data, pos, modes >> 6, "ll", state)
    pos = _seq_table(data, pos, (modes >> 4) & 3, "of", state)
    pos = _seq_table(data, pos, (modes >> 2) & 3, "ml", state)
    (ll_t, ll_log), (of_t, of_log), (ml_t, ml_log) = state["ll"], state["of"], state["ml"]
    stream = _Back(data[pos:])
    ll_s, of_s, ml_s = stream.read(ll_log), stream.read(of_log), stream.read(ml_log)
    reps, lit_at = state["reps"], 0
    for i in range(n):
        ll_code, of_code, ml_code = ll_t[ll_s][0], of_t[of_s][0], ml_t[ml_s][0]
        if of_code > 31 or ll_code > 35 or ml_code > 52:
            raise UnpackError("ZSTD sequence code out of range")
        offset = (1 << of_code) + stream.read(of_code)
        match = _ML_BASE[ml_code] + stream.read(_ML_BITS[ml_code])
        lit = _LL_BASE[ll_code] + stream.read(_LL_BITS[ll_code])
        if offset > 3:
            offset -= 3
            reps[:] = [offset, reps[0], reps[1]]
        else:
            idx = offset - 1 + (1 if lit == 0 else 0)  # with no literals, each repeat shifts by one
            if idx == 0:
                offset = reps[0]
            elif idx == 3:
                offset = reps[0] - 1
                if offset <= 0:
                    raise UnpackError("ZSTD repeat offset of zero")
                reps[:] = [offset, reps[0], reps[1]]
            else:
                offset = reps[idx]
                reps[:] = [offset, reps[0], reps[2] if idx == 1 else reps[1]]
        if lit_at + lit > len(literals):
            raise UnpackError("ZSTD sequence takes more literals than the block has")
        out += literals[lit_at : lit_at + lit]
        lit_at += lit
        if offset > len(out) or len(out) + match > limit:
            raise UnpackError(f"ZSTD match (offset {offset}) outside the output or over the cap")
        _copy_match(out, offset, match)
        if i + 1 < n:  # states update in the order LL, ML, OF
            _, nb, base = ll_t[ll_s]
            ll_s = base + stream.read(nb)
            _, nb, base = ml_t[ml_s]
            ml_s = base + stream.read(nb)
            _, nb, base = of_t[of_s]
            of_s = base + stream.read(nb)
    if stream.pos != 0:
        raise UnpackError("ZSTD sequence stream does not end where its sequences do")
    out += literals[lit_at:]


def _frame(src, pos, out, limit, stop):
    desc = src[pos]
    pos += 1
    fcs_flag, single, checksum, dict_flag = desc >> 6, (desc >> 5) & 1, (desc >> 2) & 1, desc & 3
    if desc & 8:
        raise UnpackError("ZSTD frame header with its reserved bit set")
    pos += 0 if single else 1
    dict_size = (0, 1, 2, 4)[dict_flag]
    if dict_size and int.from_bytes(src[pos : pos + dict_size], "little"):
        raise UnpackError("ZSTD frame needs a dictionary")
    pos += dict_size + ((1 if single else 0), 2, 4, 8)[fcs_flag]
    state = {"reps": [1, 4, 8]}
    while True:
        if pos + 3 > len(src):
            raise UnpackError("ZSTD block header runs past the input")
        head = int.from_bytes(src[pos : pos + 3], "little")
        last, kind, size = head & 1, (head >> 1) & 3, head >> 3
        pos += 3
        if kind == 1:
            if len(out) + size > limit:
                raise UnpackError("ZSTD output over the cap")
            out += bytes([src[pos]]) * size
            pos += 1
        else:
            if pos + size > len(src):
                raise UnpackError("ZSTD block runs past the input")
            block = src[pos : pos + size]
            if kind == 0:
                out += block
            elif kind == 2:
                literals, at = _literals(block, 0, state)
                _sequences(block, at, literals, out, state, limit)
            else:
                raise UnpackError("ZSTD block of the reserved type")
            pos += size
        if len(out) > limit:
            raise UnpackError("ZSTD output over the cap")
        if last or (stop is not None and len(out) >= stop):
            return pos + (4 if checksum else 0)


def zstd(src, size, limit, stop=None):
    """The ``size`` bytes the ZSTD frames in ``src`` decode to (skippable frames skipped; the
    content checksum is not verified: the stated size and the ELF or PTX read after are); only
    the first ``stop`` bytes when it is given."""
    if size > limit:
        raise UnpackError(f"states {size} bytes, over the {limit}-byte cap")
    src, out, pos = bytes(src), bytearray(), 0
    while pos + 4 <= len(src):
        magic = int.from_bytes(src[pos : pos + 4], "little")
        if 0x184D2A50 <= magic <= 0x184D2A5F:
            pos += 8 + int.from_bytes(src[pos + 4 : pos + 8], "little")
            continue
        if magic != ZSTD_MAGIC:
            if any(src[pos:]):
                raise UnpackError(f"no ZSTD frame at byte {pos} (magic {magic:#x})")
            break  # the entry's padding
        try:
            pos = _frame(src, pos + 4, out, size, stop)
        except IndexError:
            raise UnpackError("ZSTD input ends inside a frame") from None
        if stop is not None and len(out) >= stop:
            return bytes(out[:stop])
    if len(out) != size:
        raise UnpackError(f"decodes to {len(out)} bytes, the header states {size}")
    return bytes(out)
