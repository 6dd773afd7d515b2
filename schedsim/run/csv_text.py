"""CSV text of integer, decimal and label columns, built with numpy, byte for byte as pyarrow's
CSV writer gives it.

pyarrow's writer spends about 0.75 s of CPU on 2,000,000 rows of nine integer columns and 1.1 s
on the per-request table: it renders each value on its own. Here a field is a few 4-byte units,
each looked up in a small table (a separator and three digits, four digits, a decimal point and
three digits, a label), with NUL for every byte to leave out (leading zeros, a fraction's
trailing zeros, a null's value); a chunk's text is its rows' units with the NULs taken out.

Decimals are ``k / 10**digits`` for integer ``k`` (the per-request table's seconds and
milliseconds from integer nanoseconds). Their text is exact: pyarrow writes a float's shortest
round-trip text, which for ``k / 10**digits`` is the decimal ``k``·10^-digits without trailing
zeros while the float's spacing is finer than 10^-digits (integer parts below 10**6 keep it so
for 9 digits and for 6); below 1e-6 pyarrow writes an exponent. Values outside these ranges
(negative, too large, a positive time under 1e-6) raise :class:`Unsupported`, and the caller
writes that chunk with pyarrow.
"""

from __future__ import annotations

from functools import cache

import numpy as np

_UNIT = np.dtype("<u4")
_MAX_INT_PART = 10**6   # decimals: integer parts below this are exact (module docstring)
_MAX_INTEGER = 10**15   # integers: up to 3 + 4 * 3 digits


class Unsupported(ValueError):
    """A column holds a value whose text this module does not make (pyarrow's is needed)."""


def _units(raw: np.ndarray) -> np.ndarray:
    """Rows of 4 bytes (uint8, NUL for a byte left out) as one little-endian unit each."""
    return np.ascontiguousarray(raw, dtype=np.uint8).view(_UNIT).ravel()


def _digits(width: int) -> np.ndarray:
    """(10**width, width) ASCII digits of 0 .. 10**width - 1, zero-padded."""
    values = np.arange(10**width)[:, None]
    return (values // 10 ** np.arange(width - 1, -1, -1) % 10 + ord("0")).astype(np.uint8)


def _lead_stripped(width: int, keep_zero: bool) -> np.ndarray:
    """The digits with leading zeros as NUL; 0 as ``"0"`` when ``keep_zero``, else all NUL."""
    digits = _digits(width)
    values = np.arange(10**width)[:, None]
    keep = values >= 10 ** np.arange(width - 1, -1, -1)
    if keep_zero:
        keep[:, -1] = True
    return np.where(keep, digits, 0).astype(np.uint8)


def _trail_stripped(width: int) -> np.ndarray:
    """The digits with trailing zeros as NUL (0: all NUL)."""
    digits = _digits(width)
    values = np.arange(10**width)[:, None]
    keep = values % 10 ** np.arange(width, 0, -1) != 0
    return np.where(keep, digits, 0).astype(np.uint8)


def _prefixed(prefix: int, digits: np.ndarray, blank: np.ndarray | None = None) -> np.ndarray:
    """``prefix`` (a byte, 0 for none) before each row of 3 digits; NUL too where ``blank``."""
    first = np.full((len(digits), 1), prefix, np.uint8)
    if blank is not None:
        first[blank] = 0
    return np.hstack([first, digits])


@cache
def _tables() -> dict:
    """The lookup tables (made on first use, about 2 ms)."""
    nul = np.zeros((1000, 1), np.uint8)
    zero = np.arange(1000) == 0
    t = {
        # Four digits: [full | leading zeros NUL, 0 all NUL | leading zeros NUL, 0 as "0"].
        "group": _units(np.vstack([_digits(4), _lead_stripped(4, False), _lead_stripped(4, True)])),
        # A fraction's first three digits after the point: [full | trailing zeros NUL, the point
        # too when all are zero]; the next three digits, padded: [full | trailing zeros NUL].
        "point": _units(np.vstack([_prefixed(ord("."), _digits(3)), _prefixed(ord("."), _trail_stripped(3), zero)])),
        "digits": _units(np.vstack([np.hstack([_digits(3), nul]), np.hstack([_trail_stripped(3), nul])])),
    }
    for sep in (ord("\n"), ord(",")):
        # A field's first unit: separator and its top three digits, leading zeros NUL:
        # [0 as the separator alone | 0 as separator and "0"].
        t[sep] = _units(np.vstack([_prefixed(sep, _lead_stripped(3, False)), _prefixed(sep, _lead_stripped(3, True))]))
    return t


class Rows:
    """CSV rows of ``n`` values per column, the columns added in order, then :meth:`text`.

    Each row begins with the newline that ends the row before it (one unit fewer per row than
    a newline at the end): :meth:`text` gives ``"\\n" row "\\n" row ...``, so the header goes
    without its newline and the file ends with :data:`END`."""

    def __init__(self, n: int, first: bool = True):
        """``first``: the rows' first column comes first in the file's rows (else the columns
        added here are a block to :meth:`repeat` in another Rows)."""
        self.n, self._first = n, first
        self._units: list[np.ndarray] = []  # each (n,) or (n, k) units, in row order
        self._t = _tables()

    def _sep(self) -> int:
        return ord(",") if self._units or not self._first else ord("\n")

    def repeat(self, block: "Rows", index: np.ndarray) -> None:
        """The columns of ``block`` (Rows of distinct values, ``first=False``), row ``index[i]``
        of it in row i: columns whose values repeat (a batch's start, end and size shared by
        its requests) are made once per distinct row and copied as one block."""
        units = np.hstack([u if u.ndim == 2 else u[:, None] for u in block._units])
        self._units.append(units.take(index, axis=0))

    def integer(self, values: np.ndarray, valid: np.ndarray | None = None) -> None:
        """A column of non-negative integers (empty where not ``valid``)."""
        k = np.asarray(values).astype(np.int64, copy=False)
        if valid is not None:
            k = np.where(valid, k, 0)
        top = int(k.max()) if len(k) else 0
        if len(k) and (k.min() < 0 or top >= _MAX_INTEGER):
            raise Unsupported("integer outside [0, 1e15)")
        self._integer(k, top, valid, self._sep())

    def decimal(self, values: np.ndarray, digits: int, valid: np.ndarray | None = None) -> None:
        """A column of ``values / 10**digits`` (``values`` non-negative integers, ``digits`` 3, 6
        or 9) as pyarrow writes the float (empty where not ``valid``)."""
        if digits not in (3, 6, 9):
            raise ValueError(f"digits: {digits} is not 3, 6 or 9")
        k = np.asarray(values, dtype=np.int64)
        if valid is not None:
            k = np.where(valid, k, 0)
        # Integer division by a constant and a multiply-subtract, not divmod or %: numpy divides
        # by a scalar with libdivide (about 0.7 ns a value) but takes a remainder with the
        # hardware's division (about 2 ns).
        scale = 10**digits
        whole = k // scale
        rest = whole * scale
        np.subtract(k, rest, out=rest)
        top = int(whole.max()) if len(k) else 0
        if len(k):
            low = k.min()
            if top >= _MAX_INT_PART or low < 0:
                raise Unsupported("decimal outside [0, 1e6)")
            # pyarrow writes a positive value under 1e-6 with an exponent.
            tiny = 10 ** max(digits - 6, 0)
            if low < tiny and np.min(k, where=k > 0, initial=tiny) < tiny:
                raise Unsupported("decimal under 1e-6")
        self._integer(whole, top, valid, self._sep())
        for i in range(digits // 3, 0, -1):
            table = self._t["point"] if i == digits // 3 else self._t["digits"]
            if i > 1:
                scale = 1000 ** (i - 1)
                index = rest // scale
                rest -= index * scale
                # trailing zeros stripped when nothing follows
                np.add(index, 1000, out=index, where=rest == 0)
            else:
                index = rest
                index += 1000
            self._units.append(table.take(index))

    def labels(self, codes: np.ndarray, names) -> None:
        """A column of ``names[code]``, quoted as pyarrow quotes strings (the names hold no quote)."""
        codes = np.asarray(codes, dtype=np.intp)
        if len(codes) and (codes.min() < 0 or codes.max() >= len(names)):
            raise Unsupported("label code outside the names")
        sep = bytes([self._sep()])
        texts = [sep + b'"' + name.encode() + b'"' for name in names]
        used = np.bincount(codes, minlength=len(texts)) > 0
        width = -(-max([len(s) for s, u in zip(texts, used) if u], default=1) // 4) * 4
        raw = np.zeros((len(texts), width), np.uint8)
        for i, s in enumerate(texts):
            if used[i]:
                raw[i, :len(s)] = np.frombuffer(s, np.uint8)
        self._units.append(raw.view(_UNIT).take(codes, axis=0))

    def _integer(self, k: np.ndarray, top: int, valid: np.ndarray | None, sep: int) -> None:
        """Units of non-negative integers ``k`` up to ``top`` < 10**15: the separator and the
        top three digits, then one unit of four digits per further 10**4."""
        t = self._t
        more = 0
        while top >= 1000 * 10 ** (4 * more):
            more += 1
        if more == 0:
            index = k + 1000 if valid is None else k + 1000 * valid  # a null: the separator alone
            self._units.append(t[sep].take(index))
            return
        above = k // 10 ** (4 * more)
        self._units.append(t[sep].take(above))
        for j in range(more - 1, -1, -1):
            # This group's four digits: k // scale less 10**4 times the digits above them (a
            # multiply-subtract, not %: see decimal).
            scale = 10 ** (4 * j)
            above *= 10000
            if j:
                index = k // scale
                index -= above
                above += index
            else:
                index = k - above
            # Nothing above: leading zeros stripped (the last unit keeps a "0", but a null's).
            np.add(index, 20000 if j == 0 else 10000, out=index, where=k < scale * 10000)
            if j == 0 and valid is not None:
                np.subtract(index, 10000, out=index, where=~valid)
            self._units.append(t["group"].take(index))

    def text(self) -> bytearray:
        """The rows' bytes, each row after a newline."""
        # Each column's units are one field of a row record ("V4", "V8", ...), so that a block of
        # k units is copied as one k*4-byte item a row: numpy copied a (n, k) block unit by unit,
        # at twice the time.
        sizes = [_UNIT.itemsize * (1 if u.ndim == 1 else u.shape[1]) for u in self._units]
        offsets = np.cumsum([0, *sizes]).tolist()
        row = np.dtype({"names": [f"f{i}" for i in range(len(sizes))], "formats": [f"V{s}" for s in sizes],
                        "offsets": offsets[:-1], "itemsize": offsets[-1]})
        # The units laid out in a bytearray's own memory: translated in place of a copy.
        buffer = bytearray(self.n * row.itemsize)
        rows = np.frombuffer(buffer, row)
        for name, size, u in zip(row.names, sizes, self._units):
            rows[name] = u.view(f"V{size}").reshape(self.n)
        self._units.clear()
        del rows
        # translate drops the NULs at about 0.6 ns a byte; a numpy boolean mask over the same
        # bytes took twice as long.
        return buffer.translate(None, b"\0")


END = b"\n"
"""What follows the last chunk of :meth:`Rows.text` at the end of the file."""
