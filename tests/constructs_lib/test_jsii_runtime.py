"""The jsii kernel started without its relay process and without a stack trace per token
(constructs_lib/jsii_runtime.py) synthesizes the same bytes as jsii's packaged entry point."""

from __future__ import annotations

import base64
import importlib.resources
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsii._embedded.jsii as embedded
import pytest

from clusters.errors import UserError
from constructs_lib import jsii_runtime
from stacks.parallel import one_core

REPO_ROOT = Path(__file__).resolve().parents[2]
FLEET = REPO_ROOT / "tests" / "fleet" / "clusters"
# Synthesizes the example fleet in one process, then prints the kernel's command line and its child processes.
CHILD = """
import sys
from pathlib import Path
from clusters.loader import load_all
from stacks.synth import synthesize
synthesize(load_all(Path(sys.argv[1])), Path(sys.argv[2]), jobs=1, imported_dir=Path(sys.argv[3]))
from jsii._runtime import kernel
pid = kernel.provider._process._process.pid
tasks = Path(f"/proc/{pid}/task")
children = [c for t in tasks.iterdir() for c in (t / "children").read_text().split()]
print((Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\\0", b" ").decode(), children))
"""


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _synthesize(tmp_path: Path, name: str, runtime: str) -> tuple[dict[str, bytes], str, list[str]]:
    imported = tmp_path / "imported"
    imported.mkdir(exist_ok=True)
    # Recorded imports: apply_imports reads every resource's friendly_unique_id right after the pins (stacks/imported.py).
    (imported / "dev-gke.json").write_text(json.dumps({"google_compute_network.vpc": "projects/p/global/networks/v",
                                                        "google_compute_router.router": "projects/p/regions/r/routers/r"}))
    env = dict(os.environ, GPUFLEET_JSII_RUNTIME=runtime, GPUFLEET_SYNTH_CACHE="off", PYTHONPATH=str(REPO_ROOT))
    env.pop("JSII_RUNTIME", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(FLEET), str(tmp_path / name), str(imported)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True)
    cmdline, children = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 (our own child's repr)
    return _tree(tmp_path / name), cmdline, children


def test_direct_kernel_synthesizes_the_bytes_of_jsii_packaged_entry_point(tmp_path: Path) -> None:
    packaged, packaged_cmd, packaged_children = _synthesize(tmp_path, "packaged", "packaged")
    direct, direct_cmd, direct_children = _synthesize(tmp_path, "direct", "")
    assert "bin/jsii-runtime.js" in packaged_cmd and len(packaged_children) == 1  # jsii's relay and its kernel
    assert "lib/gpufleet-kernel.js" in direct_cmd and direct_children == []  # the kernel itself, no relay
    assert sorted(direct) == sorted(packaged) and len(direct) > 5
    assert json.loads(packaged["stacks/dev-gke/cdk.tf.json"])["import"][0]["to"] == "google_compute_network.vpc"
    assert [name for name in packaged if direct[name] != packaged[name]] == []


def test_program_js_reads_stdin_and_writes_stdout(tmp_path: Path) -> None:
    launcher = jsii_runtime.write_runtime(tmp_path)
    assert launcher == tmp_path / jsii_runtime.LAUNCHER
    program = (tmp_path / jsii_runtime.PROGRAM).read_bytes()
    assert program.count(b"readFD:0,writeFD:1") == 1 and b"readFD:3,writeFD:3" not in program
    assert program.count(jsii_runtime._HOOKED_HOST) == 1 and jsii_runtime._HOST not in program
    assert program.count(jsii_runtime._LAZY_MESSAGE) == 1 and jsii_runtime._EAGER_MESSAGE not in program
    assert (tmp_path / "lib" / "runtime-index-worker.js").is_file()  # the kernel starts it from its own folder


def test_the_type_assert_fails_and_passes_as_jsii_s_own_with_its_message_built_only_on_failure() -> None:
    """Both texts evaluated by Node with what they name in program.js (``assert``, ``util``): for each value the
    same outcome and message; the replacement calls ``inspect`` only for a missing value. Falsy values that are not
    missing (0, "", false, NaN) must pass like the original's ``null!=e`` does (a ``e||`` rewrite would fail them)."""
    program = importlib.resources.files(embedded).joinpath("lib__program.js").read_text(encoding="utf-8")
    # In computeSerializationType's module, B is assert (``__importDefault``: ``{default: assert}``) and K is util.
    assert program.count("B=F(m(2613)),K=m(9023)") == 1 and program.count('function computeSerializationType(e,p)') == 1
    assert program.index("B=F(m(2613)),K=m(9023)") < program.index("function computeSerializationType(e,p)")
    assert 'F=this&&this.__importDefault||function(e){return e&&e.__esModule?e:{default:e}}' in program
    assert '2613(e){"use strict";e.exports=require("assert")}' in program
    assert '9023(e){"use strict";e.exports=require("util")}' in program
    script = """
const B = { default: require("assert") }, util = require("util");
let inspected = 0;
const K = { inspect: (v) => { inspected++; return util.inspect(v); } };
const out = [];
for (const e of [undefined, null, 0, "", false, NaN, "void", { type: { primitive: "any" } }]) {
  const row = [];
  for (const text of [EAGER, LAZY]) {
    inspected = 0;
    try { eval(text); row.push(["ok", inspected]); } catch (error) { row.push([error.name + ": " + error.message, inspected]); }
  }
  out.push(row);
}
console.log(JSON.stringify(out));
""".replace("EAGER", json.dumps(jsii_runtime._EAGER_MESSAGE.decode())).replace("LAZY", json.dumps(jsii_runtime._LAZY_MESSAGE.decode()))
    done = subprocess.run([shutil.which("node") or "node", "-e", script], capture_output=True, text=True, check=True, timeout=60)
    rows = json.loads(done.stdout)
    for (eager, eager_calls), (lazy, lazy_calls) in rows:
        assert eager == lazy
        assert eager_calls == 1 and lazy_calls == (0 if eager == "ok" else 1)
    assert [row[0][0] for row in rows][:2] == ["AssertionError: Kernel error: expected type information, got undefined",
                                               "AssertionError: Kernel error: expected type information, got null"]


def test_launcher_keeps_the_channel_clean_drops_token_traces_and_keeps_error_stacks(tmp_path: Path) -> None:
    """Console output travels as the relay sends it ({"stdout": base64} lines on stderr), never on the
    API channel; a plain object gets no stack trace (cdktf's tokens), an Error still does."""
    launcher = jsii_runtime.write_runtime(tmp_path)
    assert launcher is not None
    (tmp_path / jsii_runtime.PROGRAM).write_text("""
const fs = require("fs");
console.log("hello from a construct");
const token = { stack: "" };
Error.captureStackTrace(token);
const error = new Error("boom");
fs.writeSync(1, JSON.stringify({ token: token.stack, error: error.stack.split("\\n").length,
  preserveSymlinks: process.execArgv.includes("--preserve-symlinks") }) + "\\n");
""")
    done = subprocess.run([shutil.which("node") or "node", str(launcher)], capture_output=True, text=True, check=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    out = json.loads(done.stdout)  # the channel holds only what the program wrote to it
    assert out["token"] == "" and out["error"] > 1 and out["preserveSymlinks"] is True
    printed = [json.loads(line) for line in done.stderr.splitlines()]
    assert printed == [{"stdout": base64.b64encode(b"hello from a construct\n").decode()}]


def test_an_unexpected_program_js_falls_back_to_jsii_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsii_runtime, "_CHANNEL", b"readFD:7,writeFD:7")
    assert jsii_runtime.write_runtime(tmp_path) is None


def test_direct_kernel_sets_the_variables_only_while_the_kernel_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsii_runtime, "kernel_running", lambda: False)
    monkeypatch.setitem(jsii_runtime._state, "launcher", tmp_path / "gpufleet-kernel.js")
    monkeypatch.delenv("JSII_RUNTIME", raising=False)
    monkeypatch.setenv("NODE_OPTIONS", "--trace-warnings")
    monkeypatch.delenv(jsii_runtime.RUNTIME_ENV, raising=False)
    with jsii_runtime.direct_kernel():
        assert os.environ["JSII_RUNTIME"] == str(tmp_path / "gpufleet-kernel.js")
        assert os.environ["NODE_OPTIONS"] == "--trace-warnings --preserve-symlinks"
    assert "JSII_RUNTIME" not in os.environ and os.environ["NODE_OPTIONS"] == "--trace-warnings"
    monkeypatch.setenv(jsii_runtime.RUNTIME_ENV, "packaged")
    with jsii_runtime.direct_kernel():
        assert "JSII_RUNTIME" not in os.environ


def test_one_core_pins_this_thread_and_what_it_starts_then_restores() -> None:
    allowed = os.sched_getaffinity(0)
    core = max(allowed)
    with one_core(core):
        assert os.sched_getaffinity(0) == {core}
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
        assert child.stdout.strip() == f"[{core}]"
    assert os.sched_getaffinity(0) == allowed


@pytest.mark.parametrize("value", ["pakaged", "jsii", "0"])
def test_an_unknown_runtime_choice_is_a_one_line_error(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt ``GPUFLEET_JSII_RUNTIME`` silently kept the direct kernel the user meant to turn off."""
    monkeypatch.setenv(jsii_runtime.RUNTIME_ENV, value)
    with pytest.raises(UserError, match=rf"GPUFLEET_JSII_RUNTIME='{value}': .*'packaged'.* or unset it"):
        with jsii_runtime.direct_kernel():
            pass


def test_a_kernel_crash_reaches_the_user_as_text(tmp_path: Path) -> None:
    """An exception nobody catches in the kernel (a construct's timer, a rejected promise) is printed by
    Node straight to fd 2: through jsii's relay the user read it as text, without it jsii's stderr reader
    printed every line as a Python bytes literal (``b'Error: boom\\\\n'``). It travels as console output does."""
    launcher = jsii_runtime.write_runtime(tmp_path)
    assert launcher is not None
    (tmp_path / jsii_runtime.PROGRAM).write_text('setTimeout(() => { throw new Error("boom in a construct"); }, 10);\n')
    done = subprocess.run([shutil.which("node") or "node", str(launcher)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 1 and done.stdout == ""  # still a crash, and nothing on the API channel
    printed = b"".join(base64.b64decode(json.loads(line)["stderr"]) for line in done.stderr.splitlines()).decode()
    assert "Error: boom in a construct" in printed and "program.js" in printed


def test_javascript_reading_stdin_cannot_take_the_kernel_requests(tmp_path: Path) -> None:
    """The kernel reads its requests from fd 0 here; jsii's relay gave the program an empty stdin, so a
    library that listens on ``process.stdin`` (a prompt, a "press a key") got nothing. It must still get
    nothing rather than swallow the requests meant for the kernel."""
    launcher = jsii_runtime.write_runtime(tmp_path)
    assert launcher is not None
    (tmp_path / jsii_runtime.PROGRAM).write_text("""
const fs = require("fs");
let stolen = "";
process.stdin.on("data", (data) => { stolen += data; });
setTimeout(() => {
  const buffer = Buffer.alloc(100);
  const read = fs.readSync(0, buffer);
  fs.writeSync(1, JSON.stringify({ kernel: buffer.subarray(0, read).toString(), stolen }) + "\\n");
}, 200);
""")
    done = subprocess.run([shutil.which("node") or "node", str(launcher)], input='{"request":1}\n', capture_output=True,
                          text=True, check=True, timeout=60)
    assert json.loads(done.stdout) == {"kernel": '{"request":1}\n', "stolen": ""}


# Pins logical ids in a kernel started through the launcher (constructs_lib/jsii_messages.py, "Logical ids ride
# along"); prints the requests written to the kernel per step and the synthesized locals' names.
PINS_CHILD = """
import json, sys
from pathlib import Path
from constructs_lib.jsii_runtime import direct_kernel
with direct_kernel():
    import cdktf
import jsii
from constructs import Construct
from constructs_lib import jsii_messages, providers  # noqa: F401  (installs the messages' send)
from constructs_lib.naming import pin
from jsii._runtime import kernel

pipe = kernel.provider._process._process
written = []
class Counting:
    def __init__(self, raw):
        self.raw = raw
    def write(self, data):
        written.append(json.loads(data))
        return self.raw.write(data)
    def flush(self):
        return self.raw.flush()
    def __getattr__(self, name):
        return getattr(self.raw, name)
pipe.stdin = Counting(pipe.stdin)

app = cdktf.App(outdir=sys.argv[1])
stack = cdktf.TerraformStack(app, "s")
before = len(written)
locals_ = [pin(cdktf.TerraformLocal(stack, f"l{i}", expression=str(i)), f"pinned-{i}") for i in range(20)]
creates = len(written) - before
late = cdktf.TerraformLocal(stack, "late", expression="late")

@jsii.implements(cdktf.IStringProducer)
class PinLate:
    def produce(self, context):  # a kernel callback: the override waits, then its "complete" is sent
        pin(late, "pinned_in_a_callback")
        return "produced"

resolver = cdktf.DefaultTokenResolver(cdktf.StringConcat())
assert cdktf.Tokenization.resolve(cdktf.Lazy.string_value(PinLate()), scope=stack, resolver=resolver) == "produced"
app.synth()
names = sorted(json.loads((Path(sys.argv[1]) / "stacks" / "s" / "cdk.tf.json").read_text())["locals"])
late_id = late.friendly_unique_id
kinds = ["complete" if "complete" in r else r.get("api") for r in written]
after_pin = kinds[next(i for i, r in enumerate(written) if r.get("gpufleet.pins") and r["gpufleet.pins"][0][1] == "pinned_in_a_callback"):]
try:
    jsii_messages.defer_logical_id(Construct(stack, "not-an-element"), "bad")
    cdktf.TerraformLocal(stack, "after", expression="x")
    error = None
except Exception as exc:  # noqa: BLE001
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"ride_along": jsii_messages._state.get("pins"), "creates": creates, "names": names,
                  "pins_sent": [len(r.get("gpufleet.pins", [])) for r in written if "gpufleet.pins" in r],
                  "override_requests": sum(r.get("method") == "overrideLogicalId" for r in written),
                  "late_id": late_id, "after_pin": after_pin[:2],
                  "error": error}))
"""


def _child_through_the_launcher(code: str, out: Path) -> dict:
    """``code`` run in a fresh interpreter whose kernel starts as gpufleet starts it (no runtime chosen by the
    environment); its last line of output, as JSON."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("JSII_RUNTIME", None)
    env.pop(jsii_runtime.RUNTIME_ENV, None)
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_logical_ids_ride_along_with_the_next_request_and_reach_the_output(tmp_path: Path) -> None:
    """Through the launcher, ``pin`` sends no request of its own: 20 overrides travel on the next requests,
    one pinned inside a kernel callback goes ahead of that callback's ``complete`` on a ``stats`` request (the
    kernel does not hand a ``complete`` to ``processRequest``, so it could not carry it), and every pinned
    name is in the synthesized JSON.
    An override the kernel refuses fails the request that carried it, naming the override."""
    out = _child_through_the_launcher(PINS_CHILD, tmp_path / "out")
    assert out["ride_along"] is True
    assert out["override_requests"] == 0
    assert out["creates"] == 20  # one request per element, none per override
    assert sum(out["pins_sent"]) == 22
    assert out["names"] == sorted(["pinned_in_a_callback"] + [f"pinned_{i}" for i in range(20)])
    assert out["after_pin"] == ["stats", "complete"] and out["late_id"] == "pinned_in_a_callback"
    assert out["error"] is not None and 'overrideLogicalId("bad") on constructs.Construct@' in out["error"]


EXIT_CHILD = """
import atexit, sys, tempfile, threading, time
from pathlib import Path
from clusters.termination import exit_now
out = Path(sys.argv[1])
atexit.register(lambda: (out / "hook").write_text("ran"))
kept = tempfile.TemporaryDirectory(dir=out)  # removed by weakref.finalize's exit hook if nobody cleans it up
(out / "tmpdir").write_text(kept.name)
if sys.argv[2] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread").write_text("done"))).start()
sys.stdout.write("buffered, no newline")
exit_now(7)
"""


@pytest.mark.parametrize("thread", ["", "thread"])
def test_exit_now_runs_the_exit_hooks_flushes_and_waits_for_a_thread_as_an_exit_does(tmp_path: Path, thread: str) -> None:
    """``exit_now`` skips only the interpreter's teardown: exit hooks (and the ``TemporaryDirectory`` clean-up
    behind them) run, buffered output is written, the code is kept, and a thread that is not a daemon still
    finishes first (then the process exits the usual way)."""
    done = subprocess.run([sys.executable, "-c", EXIT_CHILD, str(tmp_path), thread], cwd=REPO_ROOT,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "buffered, no newline"
    assert (tmp_path / "hook").read_text() == "ran"
    assert not Path((tmp_path / "tmpdir").read_text()).exists()
    assert (tmp_path / "thread").exists() == bool(thread)


# A kernel started before ``direct_kernel`` without any ``<package>._jsii`` module imported (``kernel_running``
# sees none), so ``direct_kernel`` sets the launcher's variables for a kernel that is already jsii's own.
EARLY_KERNEL_CHILD = """
import json, sys
from pathlib import Path
from jsii._runtime import kernel
kernel.provider._process  # starts jsii's packaged entry point; no assembly module is imported yet
from constructs_lib.jsii_runtime import direct_kernel
with direct_kernel():
    import cdktf
from constructs_lib import jsii_messages, providers  # noqa: F401  (installs the messages' send)
from constructs_lib.naming import pin
app = cdktf.App(outdir=sys.argv[1])
stack = cdktf.TerraformStack(app, "s")
pin(cdktf.TerraformLocal(stack, "l", expression="x"), "pinned")
app.synth()
print(json.dumps({"ride_along": jsii_messages._state.get("pins"),
                  "names": sorted(json.loads((Path(sys.argv[1]) / "stacks" / "s" / "cdk.tf.json").read_text())["locals"])}))
"""


def test_a_kernel_started_before_direct_kernel_keeps_its_logical_ids(tmp_path: Path) -> None:
    """``direct_kernel`` turned ride-along overrides on whenever some assembly module was imported after it set
    the variables, also when the kernel running was jsii's packaged one started earlier: that kernel ignores
    ``"gpufleet.pins"``, and the pinned local was synthesized under its construct id ``l``."""
    out = _child_through_the_launcher(EARLY_KERNEL_CHILD, tmp_path / "out")
    assert out["names"] == ["pinned"]
    assert not out["ride_along"]


# An override refused inside a kernel callback (a Lazy producer pins an element whose fqn was read), then more work.
REFUSED_IN_A_CALLBACK_CHILD = """
import json, sys
from pathlib import Path
from constructs_lib.jsii_runtime import direct_kernel
with direct_kernel():
    import cdktf
import jsii
from constructs_lib import jsii_messages, providers  # noqa: F401  (installs the messages' send)
from constructs_lib.naming import pin
app = cdktf.App(outdir=sys.argv[1])
stack = cdktf.TerraformStack(app, "s")
late = cdktf.TerraformLocal(stack, "late", expression="late")
late.fqn

@jsii.implements(cdktf.IStringProducer)
class Produce:
    def __init__(self, element):
        self.element = element
    def produce(self, context):
        if self.element is not None:
            pin(self.element, "too_late")
        return "produced"

def resolve(element):
    resolver = cdktf.DefaultTokenResolver(cdktf.StringConcat())
    return cdktf.Tokenization.resolve(cdktf.Lazy.string_value(Produce(element)), scope=stack, resolver=resolver)

try:
    resolve(late)
    error = None
except RuntimeError as exc:
    error = str(exc)
again = resolve(None)
pin(cdktf.TerraformLocal(stack, "after", expression="x"), "pinned_after")
app.synth()
print(json.dumps({"ride_along": jsii_messages._state.get("pins"), "error": error, "again": again,
                  "names": sorted(json.loads((Path(sys.argv[1]) / "stacks" / "s" / "cdk.tf.json").read_text())["locals"])}))
"""


def test_an_override_refused_in_a_callback_is_that_callbacks_error(tmp_path: Path) -> None:
    """Inside a kernel callback an override waits for the callback's ``complete`` and goes first on a ``stats``
    request; when the kernel refused it, the error was raised in Python before the ``complete`` was sent, so the
    kernel stayed inside the callback and cdktf, which called back, never saw the error (jsii's packaged runtime
    reports it as the callback's: ``Resolution error: ...``). Now it is the callback's error, and the kernel
    goes on as after any failed callback."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("JSII_RUNTIME", None)
    env.pop(jsii_runtime.RUNTIME_ENV, None)
    done = subprocess.run([sys.executable, "-c", REFUSED_IN_A_CALLBACK_CHILD, str(tmp_path / "out")], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, check=True, timeout=120)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ride_along"] is True
    assert out["error"].startswith('Resolution error: overrideLogicalId("too_late") on cdktf.TerraformLocal@')
    assert "Logical ID may not be overridden once .fqn has been requested" in out["error"]
    assert out["again"] == "produced" and out["names"] == ["late", "pinned_after"]


def test_the_request_hook_hands_on_every_argument(tmp_path: Path) -> None:
    """The launcher wraps ``KernelHost.prototype.processRequest`` for every request on every jsii whose
    ``program.js`` has the expected text, not only 1.142.0 (whose method takes three): a wrapper that passed on
    exactly three dropped whatever another release's method takes after them."""
    launcher = jsii_runtime.write_runtime(tmp_path)
    assert launcher is not None
    (tmp_path / jsii_runtime.PROGRAM).write_text("""
const Host = globalThis[Symbol.for("gpufleet.kernelHost")](class {
  processRequest(...args) { require("fs").writeSync(1, JSON.stringify(args) + "\\n"); }
});
new Host().processRequest({ api: "stats" }, null, true, "fourth");
""")
    done = subprocess.run([shutil.which("node") or "node", str(launcher)], capture_output=True, text=True, check=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert json.loads(done.stdout) == [{"api": "stats"}, None, True, "fourth"]


STREAM_CHILD = """
import sys
print("the command's last line")  # block-buffered: a file, a pipe, a device, not a terminal
if sys.argv[1] == "exit_now":
    from clusters.termination import exit_now
    exit_now(0)
sys.exit(0)
"""


def _end_with(how: str, **popen: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # the user's shell sets no such thing
    return subprocess.run([sys.executable, "-c", STREAM_CHILD, how], cwd=REPO_ROOT, env=dict(env, PYTHONPATH=str(REPO_ROOT)),
                          stderr=subprocess.PIPE, text=True, timeout=60, **popen)


@pytest.mark.parametrize("stdout", ["/dev/full", "closed"])
def test_exit_now_reports_stdout_it_could_not_write_or_open_as_an_exit_does(stdout: str) -> None:
    """Output that cannot be written when the process ends (a full disk: ``/dev/full`` is one, a closed pipe) makes
    an exit say so on stderr and end 120 (CPython's ``Py_Exit``), not 0 with the output silently lost; a stdout closed
    before start (``>&-``: ``sys.stdout`` is None) is no error at an exit, nor a traceback and 1."""
    if stdout == "closed":
        usual, fast = (_end_with(how, preexec_fn=lambda: os.close(1)) for how in ("sys.exit", "exit_now"))
    else:
        with open(stdout, "w") as device:
            usual, fast = (_end_with(how, stdout=device) for how in ("sys.exit", "exit_now"))
    assert usual.returncode == (120 if stdout == "/dev/full" else 0), usual.stderr  # the reference: a plain exit
    assert (fast.returncode, "Traceback" in fast.stderr) == (usual.returncode, False), fast.stderr
    assert ("No space left on device" in fast.stderr) == (stdout == "/dev/full"), fast.stderr


@pytest.mark.parametrize("profiler", ["cProfile", "profile"])
def test_exit_now_under_a_profiler_lets_it_write_its_results(tmp_path: Path, profiler: str) -> None:
    """``python -m cProfile -o out .venv/bin/gpufleet synth`` (how this project's profiles are taken): the profiler
    writes its results after the program's ``SystemExit``, which ``os._exit`` never raises, so the profile was
    silently missing (exit code kept). A process being profiled or traced (a debugger, coverage) exits the usual way."""
    script = tmp_path / "ends.py"
    script.write_text("from clusters.termination import exit_now\nsum(range(1000))\nexit_now(3)\n")
    done = subprocess.run([sys.executable, "-m", profiler, "-o", str(tmp_path / "out.prof"), str(script)], cwd=REPO_ROOT,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr  # the profiler's own ``except SystemExit: pass``, as for any program
    assert (tmp_path / "out.prof").is_file(), "the profile was not written"
