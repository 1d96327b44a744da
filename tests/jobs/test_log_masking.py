"""The secret detector over log text where a line is not the unit a credential arrives in: a PEM
private key printed over many lines (its body lines alone look like any base64), a stream cut
inside a very long line, a kept tail whose window starts inside a line. Each case planted a
credential that, before, reached the stream or the stored tail in whole or in part."""

from __future__ import annotations

import base64
import random

from jobs.logs import LONG_LINE_NOTE, MAX_LINE_BYTES, masked, masked_stream, read_logs, tail_text

RNG = random.Random(24)
BODY = [base64.b64encode(bytes(RNG.randrange(256) for _ in range(48))).decode() for _ in range(6)]
PEM = "\n".join(["-----BEGIN PRIVATE KEY-----", *BODY, "-----END PRIVATE KEY-----"])
GROQ = "gsk_" + "".join(RNG.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789") for _ in range(52))


def _leaks(text: str) -> list[str]:
    return [part for part in (*BODY, GROQ[8:32], GROQ[-20:]) if part in text]


def test_a_pem_private_key_printed_over_lines_is_masked_whole_in_a_read_and_a_stream() -> None:
    text = f"step 1 loss 2.3\nloading {{\n{PEM}\nstep 2 loss 2.1\n"
    kept = masked(text)
    assert not _leaks(kept), kept
    assert kept.splitlines()[0] == "step 1 loss 2.3" and kept.splitlines()[-1] == "step 2 loss 2.1"
    for cuts in ([7], [40, 41, 200], list(range(1, len(text), 13))):  # chunk boundaries anywhere, inside lines too
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        streamed = "".join(masked_stream(pieces))
        assert not _leaks(streamed) and streamed.count("[masked: private-key]") == len(BODY) + 2, streamed


def test_a_kept_tail_that_starts_inside_a_pem_key_masks_its_body_lines() -> None:
    data = f"step 1\n{PEM}\nstep 2\n".encode()
    window = len(data) - data.index(BODY[2].encode()) + 3  # the cut falls inside the third body line
    assert not _leaks(masked(tail_text(data, window)))


def test_a_streamed_line_longer_than_the_cap_never_splits_a_credential() -> None:
    line = "x" * (MAX_LINE_BYTES - 10) + f" {GROQ} more\n"
    streamed = "".join(masked_stream([line[:MAX_LINE_BYTES + 1], line[MAX_LINE_BYTES + 1:], "next\n"]))
    assert not _leaks(streamed), streamed[-200:]
    assert streamed.endswith(LONG_LINE_NOTE + "next\n")


def test_a_progress_bar_longer_than_the_cap_is_still_streamed_at_its_carriage_returns() -> None:
    bar = "".join(f"\r{i:6d}/100000 " + "#" * 40 for i in range(2000))
    streamed = "".join(masked_stream([bar, "\ndone\n"]))
    assert "  1999/100000" in streamed and streamed.endswith("done\n")


def test_a_kept_tail_cut_inside_one_long_line_keeps_no_part_of_it_and_no_broken_character() -> None:
    data = ("é" * 50 + " token " + GROQ).encode()
    for window in (40, 41, 60):
        kept = tail_text(data, window)
        assert not _leaks(kept) and "\ufffd" not in kept and len(kept.encode()) <= window, kept


def test_read_logs_of_a_runner_answering_one_long_cut_line_shows_no_part_of_a_credential() -> None:
    class Runner:
        scheduler = "test"

        def logs(self, run_id, *, tail_bytes, **_):  # noqa: ANN001, ANN202 - the runner protocol of jobs.logs
            data = ("y" * 300 + f" {GROQ}").encode()
            yield data[-(tail_bytes + 1):]

    assert not _leaks(read_logs(Runner(), "r1", tail_bytes=30))


def test_a_nomad_follow_whose_window_starts_inside_a_line_longer_than_a_frame_drops_all_of_that_line(nomad, client_for) -> None:
    """Nomad sends a follow's first window in StreamFrames of 64 KiB (client/fs_endpoint.go
    streamFrameSize, as the double does). The cut first line was dropped only from the first
    frame: when it was longer than a frame, its rest opened the second one, a credential across
    the frame boundary included."""
    import threading

    from jobs.logs import decoded
    from jobs.nomad.logs import follow

    nomad.heartbeat_seconds = 0.2
    log = "step 0\n" + "x" * 100_000 + f" {GROQ}\nstep 1\n"
    key_at = log.index(GROQ)
    start = key_at + 20 - 64 * 1024  # the first frame ends 20 characters into the key
    with nomad._lock:
        nomad.state.allocations["j"] = [{"ID": "a1", "ClientStatus": "running", "TaskStates": {"train": {"State": "running", "StartedAt": "2026-12-03T08:00:01Z"}}}]
        nomad.state.logs[("a1", "train", "stdout")] = bytearray(log.encode())
    stop, got = threading.Event(), []
    for chunk in follow(client_for(nomad), "a1", stderr=False, tail_bytes=len(log) - start, tail_lines=None, stop=stop):
        got.append(chunk)
        if b"step 1" in b"".join(got):
            stop.set()
    streamed = "".join(masked_stream(decoded(got)))
    assert not _leaks(streamed), streamed[-200:]
    assert streamed.endswith("step 1\n")


def test_a_read_tail_never_exceeds_its_byte_bound_after_decoding_and_masking() -> None:
    """Undecodable bytes become U+FFFD (three bytes each) and a masked line may be longer than
    the line it replaces: the tail kept in the database must still fit its configured bound."""
    class Runner:
        scheduler = "test"

        def __init__(self, data: bytes) -> None:
            self.data = data

        def logs(self, run_id, *, tail_bytes, **_):  # noqa: ANN001, ANN202 - the runner protocol of jobs.logs
            yield self.data[-(tail_bytes + 1):]

    for data in ((b"\xff" * 60 + b"\n") * 200, b"pwd=Zq7xR2\n" * 500, ("é" * 30 + "\n").encode() * 100):
        text = read_logs(Runner(data), "r1", tail_bytes=1000)
        assert 0 < len(text.encode()) <= 1000 and text.endswith("\n"), (len(text.encode()), text[:80])


def test_an_encrypted_pem_key_is_masked_whole_and_a_stray_begin_line_hides_nothing_after_it() -> None:
    encrypted = "\n".join(["-----BEGIN RSA PRIVATE KEY-----", "Proc-Type: 4,ENCRYPTED", "DEK-Info: AES-128-CBC,3F17F5316E2BAC89", "",
                           *BODY, "-----END RSA PRIVATE KEY-----"])
    shown = masked(f"{encrypted}\nstep 1\n")
    assert shown.splitlines() == ["[masked: private-key]"] * (len(BODY) + 5) + ["step 1"] and "DEK-Info" not in shown
    stray = masked("grep '-----BEGIN PRIVATE KEY-----' found nothing\nstep 1 loss 2.3\nstep 2 loss 2.1\n")
    assert stray.splitlines() == ["[masked: private-key]", "step 1 loss 2.3", "step 2 loss 2.1"]
