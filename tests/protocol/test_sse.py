"""The one SSE encoder and decoder, by table: each stream is decoded whole, byte by byte, and cut at
every point, and must give the same events every time; every frame the daemon writes decodes back
to what it encoded."""

from __future__ import annotations

import pytest
from salvor.protocol import ServerSentEvent, SSEDecoder, sse_frame

E = ServerSentEvent

# (what, the stream's bytes, the events, the last retry)
STREAMS = [
    ("one event", b"data: x\n\n", [E("x")], None),
    ("named, with an id", b"event: ping\nid: 7\ndata: {}\n\n", [E("{}", "ping", "7")], None),
    ("multi-line data joins with LF", b"data: a\ndata:b\ndata:  c\n\n", [E("a\nb\n c")], None),
    ("CRLF line ends", b"event: e\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n", [E("1", "e"), E("2")], None),
    ("CR line ends", b"data: 1\rdata: 2\r\r", [E("1\n2")], None),
    ("comments carry nothing", b": keep-alive\n\n:x\ndata: y\n: mid\n\n", [E("y")], None),
    (
        "no trailing blank line: close() delivers it",
        b"event: last\ndata: 1",
        [E("1", "last")],
        None,
    ),
    ("a last line ended by CR alone", b"data: 1\r", [E("1")], None),
    (
        "a block without data dispatches nothing and drops its name",
        b"event: lonely\n\ndata: z\n\n",
        [E("z")],
        None,
    ),
    (
        "an id persists across events",
        b"id: 3\ndata: a\n\ndata: b\n\n",
        [E("a", id="3"), E("b", id="3")],
        None,
    ),
    (
        "an id holding NUL is ignored",
        b"id: 1\ndata: a\n\nid: 2\x00\ndata: b\n\n",
        [E("a", id="1"), E("b", id="1")],
        None,
    ),
    ("retry is kept when all digits", b"retry: 1500\ndata: a\n\nretry: 9x\n\n", [E("a")], 1500),
    ("a field without a colon has an empty value", b"data\ndata\n\n", [E("\n")], None),
    ("unknown fields are ignored", b"foo: bar\ndata: a\n\n", [E("a")], None),
    ("a leading BOM is dropped", b"\xef\xbb\xbfdata: a\n\n", [E("a")], None),
    ("UTF-8 cut between chunks", "data: 日本\n\n".encode(), [E("日本")], None),
    ("only one leading space is removed", b"data:   x\n\n", [E("  x")], None),
    ("an empty data line", b"data:\n\n", [E("")], None),
]


def decode(chunks) -> tuple[list[ServerSentEvent], int | None]:
    decoder = SSEDecoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    return events + decoder.close(), decoder.retry


@pytest.mark.parametrize(
    ("stream", "events", "retry"), [s[1:] for s in STREAMS], ids=[s[0] for s in STREAMS]
)
def test_a_stream_decodes_the_same_whole_byte_by_byte_and_cut_anywhere(
    stream, events, retry
) -> None:
    assert decode([stream]) == (events, retry)
    assert decode([stream[i : i + 1] for i in range(len(stream))]) == (events, retry)
    for cut in range(len(stream) + 1):
        assert decode([stream[:cut], stream[cut:]]) == (events, retry), cut


def test_text_is_fed_as_its_utf8() -> None:
    assert decode(["event: e\r", "\ndata: é\n", "\n"]) == ([E("é", "e")], None)


def test_pending_counts_what_is_held_toward_the_next_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: abc\ndata: de") == [] and decoder.pending == len(b"abc\n") + len(
        b"data: de"
    )
    assert decoder.feed(b"\n\n") == [E("abc\nde")] and decoder.pending == 0


FRAMES = [
    # The run event stream's frames: the spec fixes them byte for byte.
    ({"data": '{"seq":1}', "id": 1}, b'id: 1\ndata: {"seq":1}\n\n'),
    ({"data": '{"status":{}}', "event": "end"}, b'event: end\ndata: {"status":{}}\n\n'),
    ({"comment": "keep-alive"}, b": keep-alive\n\n"),
    # A recorded provider frame replayed as it was cut.
    (
        {"data": "a\nb", "event": "content_block_delta"},
        b"event: content_block_delta\ndata: a\ndata: b\n\n",
    ),
    ({"data": "[DONE]"}, b"data: [DONE]\n\n"),
    ({"data": ""}, b"data: \n\n"),
    ({"data": "x", "retry": 2000}, b"retry: 2000\ndata: x\n\n"),
    ({"data": "x\r\ny\rz"}, b"data: x\ndata: y\ndata: z\n\n"),
]


@pytest.mark.parametrize(("fields", "frame"), FRAMES)
def test_a_frame_is_written_as_the_stream_wants_and_reads_back(fields, frame) -> None:
    assert sse_frame(**fields) == frame
    decoded, _ = decode([frame])
    if "data" in fields:
        data = fields["data"].replace("\r\n", "\n").replace("\r", "\n")
        event = ServerSentEvent(
            data, fields.get("event"), None if fields.get("id") is None else str(fields["id"])
        )
        assert decoded == [event]
    else:
        assert decoded == []


@pytest.mark.parametrize(
    "fields",
    [
        {"data": "x", "event": "a\nb"},
        {"data": "x", "id": "1\r"},
        {"id": "a\0"},
        {"comment": "two\nlines"},
    ],
)
def test_a_field_that_would_break_the_framing_is_refused(fields) -> None:
    with pytest.raises(ValueError, match="SSE"):
        sse_frame(**fields)


def test_no_daemon_module_frames_or_parses_sse_by_hand() -> None:
    # The stand-in stays apart (standard library only), so it keeps its own reader.
    import re
    from pathlib import Path

    import salvor.daemon

    by_hand = re.compile(r"""b?["'](data|event|id|retry):""")
    daemon = Path(salvor.daemon.__file__).resolve().parent
    for path in daemon.rglob("*.py"):
        if path.parent.name != "standin":
            found = [
                n for n, line in enumerate(path.read_text().splitlines(), 1) if by_hand.search(line)
            ]
            assert not found, (
                f"{path.relative_to(daemon)}:{found} frames SSE itself; "
                "use salvor.protocol.sse_frame"
            )
