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
  the stack's whole tree once more, and its ``resolve`` (``cdktf/lib/tokens/private/resolve.js``) pays
  at every node, token or not (the key path joined, two contexts per key, the options copied, a
  regular expression per string); most nodes hold no token, and a generated resource hands it every
  optional attribute, mostly ``undefined``. The launcher wraps cdktf's module-level ``resolve``
  (``cdktf/lib/_tokens.js``, the one ``TerraformStack`` calls) with a walk that copies the nodes cdktf
  would only copy (no token marker, no encoded number, none of cdktf's map-token values, plain objects
  and arrays; ``undefined`` left out) and hands every other node, with its key path, to cdktf's own
  private ``resolve``, in cdktf's order: tokens, class instances, objects with their own ``resolve`` or
  ``_children``, objects the kernel passes by reference (their getters call Python), arrays holding a
  list token, nodes past cdktf's depth limit. Only cdktf 0.21.0 is wrapped, and only with the seven files
  the walk relies on as shipped (their digests): ``tests/constructs_lib/test_resolve_walk.py`` compares
  both on the real package, edge cases, two red teams' cases and generated trees, and names what the walk
  does not reproduce (a Proxy's traps, array element getters, stack depth). About 17% of the kernel's CPU
  at 40 generated clusters (issue 28, eighth round), after an earlier wrapper that only dropped unset keys
  (about 11%).

None of these changes what is synthesized: they only touch how messages travel, what error messages
could quote, and which code copies what cdktf would copy. ``tests/stacks/test_parallel_synth.py`` compares worker processes (started this way)
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
// cdktf resolves every element's attributes twice (prepareStack, then toTerraform) and then the stack's
// whole tree once more (terraform-stack.js, toTerraform). Its resolve (lib/tokens/private/resolve.js) pays
// at every node of that tree, token or not: the key path joined into a string, a context object and its
// closures made twice per key (the second copying the path), the options spread into a new object per
// call, a TokenString and a regular expression test per string; and a generated resource hands it every
// optional attribute, most of them undefined, which it walks only to skip. Nearly all the nodes hold no
// token. So the launcher wraps cdktf's module-level resolve (cdktf/lib/_tokens.js, the one TerraformStack
// calls) with a walk that builds cdktf's result itself where cdktf's would be a plain copy, and hands
// every other node, with its key path, to cdktf's own resolve (the private one, with the options
// _tokens.js gives it): a node is copied here only when resolve.js would return it as it is or copy it
// key by key with nothing else happening, namely
//   undefined, null, a boolean;
//   a number that is no encoded token (extractTokenDouble) and not Token.NUMBER_MAP_TOKEN_VALUE;
//   a string with no "{TfToken[" in it (every string, list and map token marker has it), no run that
//     resolve.js's encoded-number pattern matches, and not one of the two map-token values;
//   an array of Array.prototype without its own some, map or constructor, none of whose elements is a string
//     with "#{TfToken[" (the list token marker) or an encoded list number (cdktf resolves such an array as a
//     list token): its elements walked in turn, holes and undefined results left out, as cdktf's some, some,
//     map and filter do (each element read three times, the length and the method taken as each starts);
//   a plain object (prototype Object.prototype or null) without its own "resolve" (a token's), "_children" (a
//     construct's) or kernel tag (an object the kernel passes by reference: its getters call Python), whose
//     keys are all such strings and none "__proto__": its values walked in key order, undefined results left out.
// Everything else (a token, a class instance, a Date, a function, a node past cdktf's depth limit, which
// it throws on) goes to cdktf whole, at the same key path, in the same order, so cdktf's own code makes
// every token's value, every side effect (cross-stack references in a preparing pass) and every error.
// What resolve.js looks up at each node (the map-token values, encoding's functions) is looked up here at each
// call and again after each node cdktf resolved (only cdktf's code runs in the middle of a walk); a replaced
// Tokenization.resolve or resolve.js export, or an Object.prototype with "resolve" or "_children", turns the walk
// off for that call.
// Not reproduced: a Proxy's traps (the kernel and cdktf make none); a getter on an array element, read more
// often when the walk hands its array to cdktf after looking at it (a list token marker or an encoded list number
// in it); a getter that changes cdktf's exports, Token's statics or its own array's "some" in the middle of a
// walk; and the JavaScript stack a token's resolve has left (more deep down, a few frames less at the top).
// Only the cdktf whose files were read for this (the version and each file's digest, REVIEWED_FILES):
// tests/constructs_lib/test_resolve_walk.py compares both on the real package over edge cases, two red teams'
// cases and 400 generated trees, and fails until a new version is named.
const Module = require("module");
const path = require("path");
const FAST = Symbol("gpufleet.fastResolve");
// The kernel tags each object it passes by reference (@jsii/kernel objects.ts); one made for a Python
// object has getters that call back into Python, which cdktf alone is to read.
const JSII_OBJID = Symbol.for("$__jsii__objid__$");
// resolve.js throws "circular reference" for a node whose key path is longer than 200, before it looks at it.
const CDKTF_MAX_DEPTH = 200;
const REVIEWED_CDKTF = "0.21.0";
// The files whose code the walk stands in for or relies on, as cdktf 0.21.0 ships them (sha256 of each, in
// lib/): resolve.js (the resolve it replaces for inert nodes), encoding.js (token markers, the encoded-number
// pattern, extractTokenDouble), token-map.js (lookupNumberToken: no token where extractTokenDouble finds none),
// token.js (the map-token values, Tokenization.resolve), resolvable.js (DefaultTokenResolver, StringConcat: no
// state), _tokens.js (what it passes) and tokens/index.js (where the walk takes them from). A cdktf with any of
// them changed (an upgrade, a patched copy) is left unwrapped; tests/constructs_lib/test_resolve_walk.py fails
// until the new text is read and named here.
const REVIEWED_FILES = {
  "tokens/private/resolve.js": "08c4dba33a40b05fd4f4c1957bd4102695c1b30df595bbb1ad1fb95fdc4a0382",
  "tokens/private/encoding.js": "5afaace6c605ac7a2da2a91f5fe0142ff0beadb69bc0c3650e9d071d136fd29f",
  "tokens/private/token-map.js": "fb8ff3b278c2b1e778bed194e6d05aaebd2bd843eadd55f30d9ab1d6061931e3",
  "tokens/token.js": "06a56ccc0d448fef5ea60be566f527b4b827a88e48eaff42c80ba9d9bc1535a8",
  "tokens/resolvable.js": "7a5de9dbe84badef22bb28a58ee235e462689a458937c4a6d1b4ab9147884953",
  "_tokens.js": "0fae1dd098cbee9f9a2bb4bdf650773035a9739086bf115b57658e61e2b466db",
  "tokens/index.js": "6e832cbee60cfcf5a0185490bc5b1734562a8e472a0816bc0349c6c0228cab52",
};
function reviewedCdktf(lib) {
  try {
    if (require(path.join(lib, "..", "package.json")).version !== REVIEWED_CDKTF) return false;
    const crypto = require("crypto");
    return Object.entries(REVIEWED_FILES).every(([file, digest]) =>
      crypto.createHash("sha256").update(fs.readFileSync(path.join(lib, file))).digest("hex") === digest);
  } catch { return false; }
}
function fastResolver(lib) {
  let resolveJs, encoding, tokens;
  try {
    resolveJs = require(path.join(lib, "tokens", "private", "resolve.js"));
    encoding = require(path.join(lib, "tokens", "private", "encoding.js"));
    tokens = require(path.join(lib, "tokens", "index.js"));
  } catch { return undefined; }
  const Tokenization = tokens.Tokenization;
  if (typeof resolveJs.resolve !== "function" || typeof encoding.extractTokenDouble !== "function" || !tokens.Token
      || !Tokenization || typeof Tokenization.resolve !== "function"
      || typeof tokens.DefaultTokenResolver !== "function" || typeof tokens.StringConcat !== "function") return undefined;
  // _tokens.js's resolve goes through Tokenization.resolve and that through resolve.js's export, each looked up at
  // each call (resolve.js then recurses through its own function): either replaced, the walk steps aside; so it
  // does when Object.prototype carries "resolve" or "_children" (every object would be a token or a construct)
  const tokenizationResolve = Tokenization.resolve, privateResolve = resolveJs.resolve;
  // what _tokens.js passes (its TOKEN_RESOLVER: a DefaultTokenResolver over a StringConcat, neither with state)
  const resolver = new tokens.DefaultTokenResolver(new tokens.StringConcat());
  // resolve.js's NUMBER_TOKEN_REGEX (encoding.js), without the global flag its test() resets
  const NUMBERISH = /[-|\\d|.\\+]+(e[-|\\d|.|e|E|\\+]+)/;
  const own = Object.prototype.hasOwnProperty;
  const ARRAY = Array.prototype;
  // cdktf reads "resolve" (a token has it as a function) and "_children" (then, if set, "_metadata": a construct
  // has both) of every object: a plain object with its own "resolve" or "_children" goes to cdktf unread (a getter
  // would answer each read); one without has none to read (Object.prototype has neither) and is no token or
  // construct. The kernel's tag is an own property too, asked without reading it.
  function plainObject(x) {
    const proto = Object.getPrototypeOf(x);
    return (proto === Object.prototype || proto === null) && !own.call(x, JSII_OBJID)
      && !own.call(x, "resolve") && !own.call(x, "_children");
  }
  // cdktf calls an array's some (twice) and map (then filter on map's result), which an array of another prototype
  // or with its own some, map or constructor (map's species) would answer differently.
  function plainArray(x) {
    return Object.getPrototypeOf(x) === ARRAY && !own.call(x, "some") && !own.call(x, "map") && !own.call(x, "constructor");
  }
  return function (scope, obj, preparing) {
    if (Tokenization.resolve !== tokenizationResolve || resolveJs.resolve !== privateResolve
        || own.call(Object.prototype, "resolve") || own.call(Object.prototype, "_children")) return undefined;
    // what resolve.js looks up at each node (encoding's function, Token's statics), taken again after every node
    // handed to cdktf: only cdktf's code (a token's resolve) runs in the middle of a walk
    let extractTokenDouble, STRING_MAP, ANY_MAP, NUMBER_MAP;
    const lookUp = () => {
      extractTokenDouble = encoding.extractTokenDouble;
      const Token = tokens.Token;
      STRING_MAP = Token.STRING_MAP_TOKEN_VALUE; ANY_MAP = Token.ANY_MAP_TOKEN_VALUE; NUMBER_MAP = Token.NUMBER_MAP_TOKEN_VALUE;
    };
    lookUp();
    const inertString = (s) => !s.includes("{TfToken[") && !NUMBERISH.test(s) && s !== STRING_MAP && s !== ANY_MAP;
    const prefix = [];
    const cdktf = (x) => {
      const resolved = privateResolve(x, { scope, preparing, resolver, prefix: prefix.slice() });
      lookUp();
      return resolved;
    };
    function walk(x) {
      if (prefix.length > CDKTF_MAX_DEPTH) return cdktf(x);
      switch (typeof x) {
        case "undefined": return undefined;
        case "boolean": return x;
        case "string": return inertString(x) ? x : cdktf(x);
        case "number": return x !== NUMBER_MAP && extractTokenDouble(x, false) === undefined ? x : cdktf(x);
        case "object": break;
        default: return cdktf(x);
      }
      if (x === null) return null;
      if (Array.isArray(x)) {
        // as cdktf's two some() (each reads the elements up to its first hit; either hit makes the array a list
        // token, which cdktf resolves whole) and then map() (holes skipped) and filter(): each takes the length as
        // it starts, and map and its species are looked up after the scans (a getter may have set its own)
        if (!plainArray(x)) return cdktf(x);
        for (let i = 0, length = x.length; i < length; i++) {
          if (i in x) { const v = x[i]; if (typeof v === "string" && v.includes("#{TfToken[")) return cdktf(x); }
        }
        for (let i = 0, length = x.length; i < length; i++) {
          if (i in x) { const v = x[i]; if (typeof v === "number" && extractTokenDouble(v, true) !== undefined) return cdktf(x); }
        }
        if (!plainArray(x)) return cdktf(x);
        const out = [];
        for (let i = 0, length = x.length; i < length; i++) {
          if (!(i in x)) continue;
          prefix.push(`${i}`);
          const v = walk(x[i]);
          prefix.pop();
          if (v !== undefined) out.push(v);
        }
        return out;
      }
      if (!plainObject(x)) return cdktf(x);
      const keys = Object.keys(x);
      for (const key of keys) if (key === "__proto__" || !inertString(key)) return cdktf(x);
      const out = {};
      for (const key of keys) {
        prefix.push(key);
        const v = walk(x[key]);
        prefix.pop();
        if (v !== undefined) out[key] = v;
      }
      return out;
    }
    return { value: walk(obj) };
  };
}
const load = Module._load;
Module._load = function (request, parent) {
  const loaded = load.apply(this, arguments);
  if (request === "./_tokens" && parent && typeof parent.filename === "string" && loaded !== null
      && (typeof loaded === "object" || typeof loaded === "function")
      && path.basename(path.dirname(parent.filename)) === "lib"
      && path.basename(path.dirname(path.dirname(parent.filename))) === "cdktf"
      && typeof loaded.resolve === "function" && !loaded.resolve[FAST] && reviewedCdktf(path.dirname(parent.filename))) {
    const fast = fastResolver(path.dirname(parent.filename));
    if (fast !== undefined) {
      const resolve = loaded.resolve;
      // _tokens.js 0.21.0: resolve(scope, obj, preparing = false); any further argument goes to cdktf's own
      const wrapped = function (scope, obj, preparing = false, ...rest) {
        const done = rest.length ? undefined : fast(scope, obj, preparing);
        return done !== undefined ? done.value : resolve.call(this, scope, obj, preparing, ...rest);
      };
      wrapped[FAST] = true;
      loaded.resolve = wrapped;
    }
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
