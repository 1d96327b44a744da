"""How gpufleet starts the jsii kernel for a synthesis: jsii's kernel program itself, without its
relay process, without a stack trace recorded for every cdktf token, and without the undefined
attributes cdktf would resolve only to skip.

A synthesis is tens of thousands of request/reply round trips between Python and the Node
kernel; per cluster, the Node side was the larger half of the CPU time and all of the memory
that grows with the fleet (bench/check.py, issue 28). Three costs in it are not the kernel's work:

- jsii's packaged entry point (``bin/jsii-runtime.js`` of ``@jsii/runtime``) spawns a second Node
  process running ``lib/program.js`` and pipes every message between its own stdin/stdout and the
  child's fd 3, so each round trip wakes four processes instead of two, and every kernel carries
  a second Node process (about 55 MB). Here ``program.js`` is started directly: a private copy in
  which its single ``readFD:3,writeFD:3`` reads requests from stdin and writes replies to stdout,
  which is what jsii's Python side is connected to. JavaScript that prints (``console.log``) is
  sent to stderr as ``{"stdout": <base64>}`` / ``{"stderr": <base64>}`` lines, exactly as the
  relay does, so the API channel stays clean and jsii's stderr reader prints it unchanged; so is
  an exception nobody catches, which Node would print straight to fd 2, before the kernel exits 1.
  JavaScript that reads ``process.stdin`` gets an empty stream, as under the relay, not the requests. The
  relay also runs the child with ``--preserve-symlinks`` (jsii's package cache links packages into
  the kernel's ``node_modules``); ``NODE_OPTIONS`` passes it while the kernel starts, and the
  launcher lists it in ``process.execArgv``, where the kernel looks for it to link a package
  with one symlink (without it, it hard-links every file of every provider and removes the tree
  at exit: seconds per kernel).
- cdktf captures a full stack trace (``Error.stackTraceLimit`` raised to ``MAX_SAFE_INTEGER``) for
  every token it creates (``lib/tokens/private/stack-trace.js``, called by ``Intrinsic``, ``Lazy``,
  ``ComplexComputedList``, dynamic blocks), and the token map keeps each formatted trace for the
  life of the process, only to quote it in an error about a token that cannot be resolved. At 100
  generated clusters these traces were about 60% of the live Node heap and a third of its CPU. The
  launcher makes ``Error.captureStackTrace`` a no-op for targets that are not ``Error`` objects
  (cdktf's and constructs' helpers pass a plain ``{stack: ""}`` and then read back no frames);
  errors keep their stacks, so a failing synthesis still reports where.

- A SIGTERM sent to the whole process group would end the kernel before its Python process, which
  unwinds on it (``clusters.termination``) and whose exit hook then fails on the closed pipe and
  leaves the kernel's temporary files. The launcher leaves SIGTERM to the Python side: the kernel
  exits when asked, or when its stdin closes because the Python process is gone. The same holds
  for SIGINT (Ctrl-C in a terminal reaches the whole foreground group).

- cdktf resolves each element's attributes twice (``prepareStack``, the stack's ``toTerraform``) and
  a generated resource hands it every optional attribute, most of them ``undefined``. For each such
  key ``resolve`` (``cdktf/lib/tokens/private/resolve.js``) builds two contexts (each copying the key
  path) and resolves the key as a string, only to skip the value. The launcher wraps cdktf's
  module-level ``resolve`` (``cdktf/lib/_tokens.js``, the one ``TerraformStack`` calls) so that it gets
  its input without those keys: only in plain objects (not in a resolvable, a class instance or an
  object with a token key, where cdktf's map-token rules count keys), only for identifier keys that
  hold no digit-``e``-digit run (cdktf would test such a key for an encoded number), never an array's
  elements, nor in an object with an own ``__proto__`` key, an object the kernel passes by reference
  (its getters call Python) or a node at cdktf's depth limit; a copy is made where something is dropped,
  so no caller's object changes. Only cdktf 0.21.0 is wrapped, the version whose ``resolve`` was read
  (``tests/constructs_lib/test_resolve_prune.py`` compares both on the real package). About 11% of the
  kernel's CPU at 100 generated clusters (issue 28, fourth round).

None of these changes what is synthesized: they only touch how messages travel, what error messages
could quote, and keys cdktf would skip. ``tests/stacks/test_parallel_synth.py`` compares worker processes (started this way)
with a synthesis in the test process (jsii's packaged entry point) byte for byte.

The files are written into a fresh private temporary directory per process (jsii extracts its
own runtime the same way on every start), removed at exit after jsii has stopped the kernel. When
the kernel is already running, ``JSII_RUNTIME`` is set by the user, ``GPUFLEET_JSII_RUNTIME=packaged``
asks for jsii's own entry point, or this jsii's ``program.js`` does not have the expected text,
nothing changes and jsii starts as packaged.
"""

from __future__ import annotations

import atexit
import importlib.resources
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clusters.errors import UserError

RUNTIME_ENV = "GPUFLEET_JSII_RUNTIME"
PROGRAM = "lib/program.js"
LAUNCHER = "lib/gpufleet-kernel.js"
_CHANNEL = b"readFD:3,writeFD:3"
_STDIO = b"readFD:0,writeFD:1"
# jsii 1.142.0's computeSerializationType asserts that it got type information with a message built before the
# assert is called: a util.inspect of the type, for every value the kernel passes as "any" (that one type is not
# cached), about 4% of the kernel's CPU. The same assert, its message built only when it fails.
_EAGER_MESSAGE = b"(0,B.default)(null!=e,`Kernel error: expected type information, got ${(0,K.inspect)(e)}`)"
_LAZY_MESSAGE = b"null!=e||(0,B.default)(!1,`Kernel error: expected type information, got ${(0,K.inspect)(e)}`)"
_HOST = b"ie=new B.KernelHost(te,"
_HOOKED_HOST = b'ie=new(globalThis[Symbol.for("gpufleet.kernelHost")](B.KernelHost))(te,'
LAUNCHER_JS = """\
"use strict";
// Written by gpufleet (constructs_lib/jsii_runtime.py): jsii's kernel program without its relay process.
const fs = require("fs");
const { Readable, Writable } = require("stream");
const captureStackTrace = Error.captureStackTrace;
Error.captureStackTrace = function (target, below) {
  if (target instanceof Error) return captureStackTrace.call(Error, target, below);
};
function relayed(key) {
  return new Writable({ write(chunk, encoding, done) {
    const data = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, encoding);
    fs.writeSync(2, JSON.stringify({ [key]: data.toString("base64") }) + "\\n");
    done();
  } });
}
const stdout = relayed("stdout"), stderr = relayed("stderr");
Object.defineProperty(process, "stdout", { configurable: true, enumerable: true, get: () => stdout });
Object.defineProperty(process, "stderr", { configurable: true, enumerable: true, get: () => stderr });
// fd 0 carries the kernel's requests: JavaScript that reads stdin gets the relay's empty one.
const stdin = Readable.from([]);
Object.defineProperty(process, "stdin", { configurable: true, enumerable: true, get: () => stdin });
// Node prints an exception nobody catches straight to fd 2, where jsii's reader expects console lines.
process.on("uncaughtException", (error) => {
  stderr.write(require("util").inspect(error) + "\\n");
  process.exit(1);
});
// A SIGTERM to the whole process group (`timeout`, a cancelled CI job) reaches this kernel too. Its Python
// process unwinds on it (clusters/termination.py) and its exit hook then asks this kernel to exit, which
// removes the kernel's temporary files; killed by the signal first, the kernel would leave them and that
// hook would fail on a closed pipe. So SIGTERM is left to the Python side; a Python process that is gone
// closes stdin, which ends this kernel too. jsii's own fallback for a kernel that does not answer its exit
// request is a SIGTERM, which this makes void: the launcher's exit hook kills such a kernel by the pid here.
process.on("SIGTERM", () => {});
// Ctrl-C reaches the whole foreground process group, this kernel too, for the same reason: its Python process
// unwinds on it (KeyboardInterrupt; the command exits 130) and stops this kernel through its exit hook. Killed by
// the signal first, the kernel left its files in TMPDIR and the user a JSONDecodeError traceback.
process.on("SIGINT", () => {});
fs.writeFileSync(require("path").join(__dirname, "kernel.pid"), String(process.pid));
// --preserve-symlinks comes through NODE_OPTIONS, which execArgv does not list; the kernel reads
// execArgv to choose between one symlink per package and a tree of hard links it removes at exit.
if (!process.execArgv.includes("--preserve-symlinks")) process.execArgv.push("--preserve-symlinks");
// cdktf resolves every element's attributes twice (prepareStack, then toTerraform) before the stack's
// whole tree once more; a generated resource hands it every optional attribute, most of them undefined,
// and resolve builds two contexts and tests a key for tokens before it skips an undefined value. Drop
// those keys first (a plain object's, whose key holds no token and no encoded number: resolving such a
// key has no effect), so resolve walks only what it keeps. Only cdktf's module-level resolve is wrapped.
const Module = require("module");
const path = require("path");
const PRUNED = Symbol("gpufleet.pruned");
// The kernel tags each object it passes by reference (@jsii/kernel objects.ts); one made for a Python
// object has getters that call back into Python, which a walk here would call once more than cdktf does.
const JSII_OBJID = Symbol.for("$__jsii__objid__$");
const INERT_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;
const NUMBERISH_KEY = /[0-9]e[0-9eE]/;
// cdktf throws "circular reference" for a value whose key path is longer than 200 before it looks at the
// value (lib/tokens/private/resolve.js), so a node at depth 200 is left whole: its undefined values still
// throw there, and a cyclic object reaches cdktf's error instead of overflowing the stack here.
const CDKTF_MAX_DEPTH = 200;
function plain(x) {
  if (x === null || typeof x !== "object") return false;
  const proto = Object.getPrototypeOf(x);
  return proto === Object.prototype || proto === null;
}
function prune(x, depth) {
  if (depth >= CDKTF_MAX_DEPTH) return x;
  if (Array.isArray(x)) {
    let out = null;
    for (let i = 0; i < x.length; i++) {
      const v = x[i], p = prune(v, depth + 1);
      if (out === null && p !== v) out = x.slice(0, i);
      if (out !== null) out.push(p);
    }
    return out === null ? x : out;
  }
  if (!plain(x) || typeof x.resolve === "function" || x[JSII_OBJID] !== undefined) return x;
  const keys = Object.keys(x);
  // An own "__proto__" key would set the copy's prototype (cdktf's result drops it, but a copy whose
  // prototype is a token would be resolved as that token): such an object is left whole.
  for (const key of keys) if (key.includes("TfToken[") || key === "__proto__") return x;
  let out = null;
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i], v = x[key];
    const drop = v === undefined && INERT_KEY.test(key) && !NUMBERISH_KEY.test(key);
    const p = drop ? undefined : prune(v, depth + 1);
    if (out === null && (drop || p !== v)) {
      out = {};
      for (let j = 0; j < i; j++) out[keys[j]] = x[keys[j]];
    }
    if (out !== null && !drop) out[key] = p;
  }
  return out === null ? x : out;
}
// Only the cdktf whose resolve was read for this (another version may give an undefined value a meaning;
// tests/constructs_lib/test_resolve_prune.py fails until the new one is read and named here).
const REVIEWED_CDKTF = "0.21.0";
function reviewedCdktf(lib) {
  try { return require(path.join(lib, "..", "package.json")).version === REVIEWED_CDKTF; } catch { return false; }
}
const load = Module._load;
Module._load = function (request, parent) {
  const loaded = load.apply(this, arguments);
  if (request === "./_tokens" && parent && path.basename(path.dirname(parent.filename)) === "lib"
      && path.basename(path.dirname(path.dirname(parent.filename))) === "cdktf"
      && typeof loaded.resolve === "function" && !loaded.resolve[PRUNED] && reviewedCdktf(path.dirname(parent.filename))) {
    const resolve = loaded.resolve;
    const pruned = function (scope, obj, ...rest) { return resolve.call(this, scope, prune(obj, 0), ...rest); };
    pruned[PRUNED] = true;
    loaded.resolve = pruned;
  }
  return loaded;
};
// Logical id overrides ride along with the next request (constructs_lib/jsii_messages.py, "gpufleet.pins"):
// program.js builds its KernelHost through this, which applies them, in order, before the request itself.
// An override that throws answers the request with that error, as processRequest answers one of its own.
const PINS = "gpufleet.pins";
globalThis[Symbol.for("gpufleet.kernelHost")] = function (KernelHost) {
  const processRequest = KernelHost.prototype.processRequest;
  KernelHost.prototype.processRequest = function (request, next, ...rest) {
    if (request !== null && typeof request === "object" && Object.prototype.hasOwnProperty.call(request, PINS)) {
      const pins = request[PINS];
      delete request[PINS];
      try {
        for (const [objref, logicalId] of pins) {
          try {
            this.kernel.invoke({ api: "invoke", objref, method: "overrideLogicalId", args: [logicalId] });
          } catch (error) {
            error.message = `overrideLogicalId(${JSON.stringify(logicalId)}) on ${objref && objref["$jsii.byref"]}: ${error.message}`;
            throw error;
          }
        }
      } catch (error) {
        this.writeError(error);
        return next();
      }
    }
    return processRequest.call(this, request, next, ...rest);  // all of them: the hook is not only on jsii 1.142.0
  };
  return KernelHost;
};
require("./program.js");
"""
_state: dict[str, Path | None] = {}


def kernel_running() -> bool:
    """Whether this process's jsii kernel has started: jsii starts it when the first assembly loads,
    which is what importing a package's ``<package>._jsii`` module does."""
    return any(name.endswith("._jsii") for name in list(sys.modules))


def write_runtime(directory: Path) -> Path | None:
    """jsii's embedded ``lib/`` files with ``program.js`` reading stdin and writing stdout, and the
    launcher; returns the launcher, or None when ``program.js`` is not the text this expects."""
    import jsii._embedded.jsii as embedded

    files = importlib.resources.files(embedded)
    for resource, relative in embedded.EMBEDDED_FILES.items():
        if not relative.startswith("lib/"):
            continue
        data = files.joinpath(resource).read_bytes()
        if relative == PROGRAM:
            if data.count(_CHANNEL) != 1 or data.count(_HOST) != 1:
                return None
            data = data.replace(_CHANNEL, _STDIO).replace(_HOST, _HOOKED_HOST)
            if data.count(_EAGER_MESSAGE) == 1:  # only speed depends on it: another text is left as it is
                data = data.replace(_EAGER_MESSAGE, _LAZY_MESSAGE)
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    if not (directory / PROGRAM).is_file():
        return None
    launcher = directory / LAUNCHER
    launcher.write_text(LAUNCHER_JS, encoding="utf-8")
    return launcher


def clean_up(directory: Path) -> None:
    """The launcher's exit hook, after jsii's: a kernel that has not exited by now (it did not answer jsii's
    exit request within jsii's 5 s, and ignores the SIGTERM jsii then sends) is killed, as that SIGTERM killed
    it before the launcher ignored it; then the launcher's files go. Only a child of this process that is
    still running is killed (``waitpid`` refuses any other pid, so a reused pid is safe)."""
    try:
        pid = int((directory / "lib" / "kernel.pid").read_text())
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except (OSError, ValueError):  # no kernel started, or it has exited (and is reaped now), or not a child
        pass
    shutil.rmtree(directory, ignore_errors=True)


def _launcher() -> Path | None:
    """This process's launcher, written on first use (None: start jsii as packaged)."""
    if "launcher" not in _state:
        directory = Path(tempfile.mkdtemp(prefix="gpufleet-jsii-"))
        atexit.register(clean_up, directory)  # runs after jsii's own exit hook stops the kernel
        try:
            _state["launcher"] = write_runtime(directory)
        except OSError:
            _state["launcher"] = None
    return _state["launcher"]


def runs_launcher(launcher: Path) -> bool:
    """Whether this process's jsii kernel is the program ``launcher`` starts. ``kernel_running`` only sees that
    an assembly's module was imported: a kernel started another way before (``jsii._runtime.kernel`` used
    directly, jsii's own entry point) is the one the import used, and it ignores ``"gpufleet.pins"``, so every
    pinned logical id would be lost without an error. Asked while the variables are still set: a kernel not yet
    started starts here, through the launcher."""
    from jsii._runtime import kernel

    args = getattr(getattr(getattr(kernel.provider, "_process", None), "_process", None), "args", None)
    return isinstance(args, list) and args[-1:] == [str(launcher)]


@contextmanager
def direct_kernel() -> Iterator[None]:
    """Start the jsii kernel (``import cdktf`` inside this block does) as this module describes.

    The variables are set only while the kernel starts (jsii copies the environment then), so no
    other child process of gpufleet inherits them."""
    choice = os.environ.get(RUNTIME_ENV, "").strip().lower()
    if choice not in ("", "packaged"):
        raise UserError(f"{RUNTIME_ENV}={os.environ[RUNTIME_ENV]!r}: not a jsii runtime gpufleet knows; "
                        "set it to 'packaged' (jsii's own entry point) or unset it")
    wanted = choice != "packaged"
    launcher = _launcher() if wanted and "JSII_RUNTIME" not in os.environ and not kernel_running() else None
    if launcher is None:
        yield
        return
    saved = os.environ.get("NODE_OPTIONS")
    os.environ["JSII_RUNTIME"] = str(launcher)
    os.environ["NODE_OPTIONS"] = f"{saved} --preserve-symlinks" if saved else "--preserve-symlinks"
    try:
        yield
        if kernel_running() and runs_launcher(launcher):  # it applies ridden-along logical ids
            from constructs_lib import jsii_messages

            jsii_messages.pins_ride_along()
    finally:
        del os.environ["JSII_RUNTIME"]
        if saved is None:
            del os.environ["NODE_OPTIONS"]
        else:
            os.environ["NODE_OPTIONS"] = saved
