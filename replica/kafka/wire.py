"""Kafka wire primitives: size-prefixed frames and the classic and flexible encodings.

Sans-I/O: a :class:`Reader` walks a bytes-like buffer, a :class:`Writer` builds one.
Decoding is total: any malformed input raises :class:`KafkaDecodeError` (never
IndexError, struct.error, UnicodeDecodeError or MemoryError), and every length is checked
against the bytes that remain before anything is allocated for it.
"""

from __future__ import annotations

import struct
import uuid

from .errors import KafkaError

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FrameDecoder",
    "KafkaDecodeError",
    "Reader",
    "Writer",
    "frame",
    "zigzag_decode",
    "zigzag_encode",
]

# Kafka's socket.request.max.bytes default (100 MiB): a larger size prefix is hostile.
DEFAULT_MAX_FRAME = 100 * 1024 * 1024

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")

Buffer = bytes | bytearray | memoryview


class KafkaDecodeError(ValueError):
    """Malformed Kafka bytes: a frame, header, message or record batch. ``error_code`` is
    the Kafka error a listener answers with where it can answer at all (a malformed
    request frame means dropping the connection, as Kafka does)."""

    error_code: KafkaError = KafkaError.CORRUPT_MESSAGE


def zigzag_encode(value: int) -> int:
    """Signed -> unsigned the way protobuf/Kafka VARINT and VARLONG do (0,-1,1,-2 -> 0,1,2,3)."""
    return (value << 1) ^ (value >> 63) if value < 0 else value << 1


def zigzag_decode(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def frame(payload: Buffer) -> bytes:
    """One size-prefixed frame (INT32 length, then the payload)."""
    return _I32.pack(len(payload)) + bytes(payload)


class FrameDecoder:
    """Splits a byte stream into frames. ``feed`` returns the complete frames so far;
    a negative or oversized length prefix raises KafkaDecodeError (drop the connection)."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: Buffer) -> list[bytes]:
        self._buf += data
        frames: list[bytes] = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= 4:
            (size,) = _I32.unpack_from(buf, pos)
            if size < 0 or size > self._max:
                raise KafkaDecodeError(f"frame size {size} outside [0, {self._max}]")
            if len(buf) - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames


class Reader:
    """Reads Kafka primitives from a buffer, bounds-checked."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: Buffer, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def _need(self, n: int) -> int:
        pos = self.pos
        if n < 0 or self.end - pos < n:
            raise KafkaDecodeError(
                f"need {n} bytes at position {pos}, {max(0, self.end - pos)} remain"
            )
        self.pos = pos + n
        return pos

    def int8(self) -> int:
        return int(_I8.unpack_from(self.buf, self._need(1))[0])

    def int16(self) -> int:
        return int(_I16.unpack_from(self.buf, self._need(2))[0])

    def uint16(self) -> int:
        return int(_U16.unpack_from(self.buf, self._need(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack_from(self.buf, self._need(4))[0])

    def uint32(self) -> int:
        return int(_U32.unpack_from(self.buf, self._need(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack_from(self.buf, self._need(8))[0])

    def float64(self) -> float:
        return float(_F64.unpack_from(self.buf, self._need(8))[0])

    def boolean(self) -> bool:
        return self.buf[self._need(1)] != 0

    def uuid(self) -> uuid.UUID:
        pos = self._need(16)
        return uuid.UUID(bytes=bytes(self.buf[pos : pos + 16]))

    def raw(self, n: int) -> bytes:
        pos = self._need(n)
        return bytes(self.buf[pos : pos + n])

    def _uvar(self, max_bytes: int) -> int:
        buf = self.buf
        pos = self.pos
        end = self.end
        result = 0
        shift = 0
        for _ in range(max_bytes):
            if pos >= end:
                raise KafkaDecodeError(f"truncated varint at position {self.pos}")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                self.pos = pos
                return result
            shift += 7
        raise KafkaDecodeError(f"varint longer than {max_bytes} bytes at position {self.pos}")

    def unsigned_varint(self) -> int:
        value = self._uvar(5)
        if value > 0xFFFFFFFF:
            raise KafkaDecodeError(f"unsigned varint {value} exceeds 32 bits")
        return value

    def varint(self) -> int:
        value = self._uvar(5)
        if value > 0xFFFFFFFF:
            raise KafkaDecodeError(f"varint {value} exceeds 32 bits")
        return zigzag_decode(value)

    def varlong(self) -> int:
        value = self._uvar(10)
        if value > 0xFFFFFFFFFFFFFFFF:
            raise KafkaDecodeError(f"varlong {value} exceeds 64 bits")
        return zigzag_decode(value)

    # Lengths: classic INT16/INT32 (-1 = null) or compact UNSIGNED_VARINT N+1 (0 = null).
    def _length(self, compact: bool, wide: bool) -> int:
        if compact:
            return self.unsigned_varint() - 1
        return self.int32() if wide else self.int16()

    def _text(self, n: int) -> str:
        pos = self._need(n)
        try:
            return str(self.buf[pos : pos + n], "utf-8") if n else ""
        except UnicodeDecodeError as exc:
            raise KafkaDecodeError(f"string at position {pos} is not UTF-8: {exc}") from exc

    def string(self, compact: bool = False) -> str:
        n = self._length(compact, False)
        if n < 0:
            raise KafkaDecodeError(f"null or negative length {n} for a non-nullable string")
        return self._text(n)

    def nullable_string(self, compact: bool = False) -> str | None:
        n = self._length(compact, False)
        if n == -1:
            return None
        if n < -1:
            raise KafkaDecodeError(f"negative string length {n}")
        return self._text(n)

    def bytes_(self, compact: bool = False) -> bytes:
        n = self._length(compact, True)
        if n < 0:
            raise KafkaDecodeError(f"null or negative length {n} for non-nullable bytes")
        return self.raw(n)

    def nullable_bytes(self, compact: bool = False) -> bytes | None:
        n = self._length(compact, True)
        if n == -1:
            return None
        if n < -1:
            raise KafkaDecodeError(f"negative bytes length {n}")
        return self.raw(n)

    def array_length(self, compact: bool = False, nullable: bool = False) -> int:
        """An array's element count (-1 for null), bounded by the bytes that remain: every
        element takes at least one byte, so a larger count is a lie."""
        n = self._length(compact, True)
        if n == -1 and nullable:
            return -1
        if n < 0:
            raise KafkaDecodeError(f"invalid array length {n}")
        if n > self.remaining:
            raise KafkaDecodeError(f"array of {n} elements in {self.remaining} bytes")
        return n

    def skip_tagged_fields(self) -> dict[int, bytes]:
        """Read a tagged-field section; returns {tag: raw bytes} for the caller to pick from."""
        count = self.unsigned_varint()
        if count > self.remaining:
            raise KafkaDecodeError(f"{count} tagged fields in {self.remaining} bytes")
        fields: dict[int, bytes] = {}
        previous = -1
        for _ in range(count):
            tag = self.unsigned_varint()
            if tag <= previous:
                raise KafkaDecodeError(f"tagged field {tag} out of order after {previous}")
            previous = tag
            fields[tag] = self.raw(self.unsigned_varint())
        return fields


class Writer:
    """Builds Kafka bytes. Encoding checks ranges (struct.error becomes ValueError)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self.parts)

    def int8(self, v: int) -> None:
        self.parts += _I8.pack(v)

    def int16(self, v: int) -> None:
        self.parts += _I16.pack(v)

    def uint16(self, v: int) -> None:
        self.parts += _U16.pack(v)

    def int32(self, v: int) -> None:
        self.parts += _I32.pack(v)

    def uint32(self, v: int) -> None:
        self.parts += _U32.pack(v)

    def int64(self, v: int) -> None:
        self.parts += _I64.pack(v)

    def float64(self, v: float) -> None:
        self.parts += _F64.pack(v)

    def boolean(self, v: bool) -> None:
        self.parts.append(1 if v else 0)

    def uuid(self, v: uuid.UUID) -> None:
        self.parts += v.bytes

    def raw(self, v: Buffer) -> None:
        self.parts += v

    def unsigned_varint(self, v: int) -> None:
        if not 0 <= v <= 0xFFFFFFFF:
            raise ValueError(f"unsigned varint {v} out of range")
        put_uvar(self.parts, v)

    def varint(self, v: int) -> None:
        if not -(1 << 31) <= v < (1 << 31):
            raise ValueError(f"varint {v} out of range")
        put_uvar(self.parts, zigzag_encode(v))

    def varlong(self, v: int) -> None:
        if not -(1 << 63) <= v < (1 << 63):
            raise ValueError(f"varlong {v} out of range")
        put_uvar(self.parts, zigzag_encode(v))

    def _length(self, n: int, compact: bool, wide: bool) -> None:
        if compact:
            self.unsigned_varint(n + 1)
        elif wide:
            self.int32(n)
        else:
            self.int16(n)

    def string(self, v: str, compact: bool = False) -> None:
        data = v.encode("utf-8")
        if len(data) > 0x7FFF:
            raise ValueError(f"string of {len(data)} bytes exceeds INT16 length")
        self._length(len(data), compact, False)
        self.parts += data

    def nullable_string(self, v: str | None, compact: bool = False) -> None:
        if v is None:
            self._length(-1, compact, False)
        else:
            self.string(v, compact)

    def bytes_(self, v: Buffer, compact: bool = False) -> None:
        self._length(len(v), compact, True)
        self.parts += v

    def nullable_bytes(self, v: Buffer | None, compact: bool = False) -> None:
        if v is None:
            self._length(-1, compact, True)
        else:
            self.bytes_(v, compact)

    def array_length(self, n: int | None, compact: bool = False) -> None:
        self._length(-1 if n is None else n, compact, True)

    def tagged_fields(self, fields: dict[int, bytes] | None = None) -> None:
        if not fields:
            self.parts.append(0)
            return
        self.unsigned_varint(len(fields))
        for tag in sorted(fields):
            data = fields[tag]
            self.unsigned_varint(tag)
            self.unsigned_varint(len(data))
            self.parts += data


def put_uvar(out: bytearray, v: int) -> None:
    """Append ``v`` (unchecked: 0 <= v) as an unsigned varint, 7 bits a byte, low first."""
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
