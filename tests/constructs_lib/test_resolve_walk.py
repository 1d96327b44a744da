"""The launcher's walk in place of cdktf's module-level ``resolve`` (constructs_lib/jsii_runtime.py) against
the real cdktf this repository pins, not a stand-in: the same script resolves the same inputs through
``cdktf/lib/_tokens.js`` once under plain Node (cdktf's own ``resolve``) and once under the launcher (the
wrapped one), and every result or error message must be the same.

The inputs are built in JavaScript so that they can hold what cdktf may meet but Python cannot send:
tokens of every kind (string, number, list, map, a token as a key), null-prototype and frozen objects,
objects shared twice, keys such as ``constructor``/``resolve``/``_children``, an own ``__proto__`` key,
undefined values at cdktf's depth limit (``prefix.length > 200`` in ``lib/tokens/private/resolve.js`` of
cdktf 0.21.0 throws before it looks at the value), a cycle, and an object the jsii kernel tags as passed
by reference (its properties are getters that call back into Python); encoded numbers inside strings,
cdktf's map-token values, sparse arrays, getters (and how often each is read), and 400 generated trees
mixing all of these. Two red teams' cases (issue 28, eighth round) too: arrays with their own ``map``/``some``/
``constructor`` or another prototype, an array a token appends to while it is resolved, Proxies, the stack
left to a token, odd packages named cdktf, a patched cdktf 0.21.0, and values cdktf looks up at each call.
``NOT_REPRODUCED`` names the few cases where the walk may differ, as constructs_lib/jsii_runtime.py says. On a
cdktf upgrade this runs on the new version, so a change in how cdktf treats any of these shows up here."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import cdktf
import constructs
import pytest

from constructs_lib import jsii_runtime

HARNESS = r"""
"use strict";
const fs = require("fs");
const path = require("path");
// As the launcher does (its first change, constructs_lib/jsii_runtime.py): tokens record no creation stack, which
// cdktf appends to a token's resolution error; so plain Node's messages are the launcher's but for the walk.
const captureStackTrace = Error.captureStackTrace;
Error.captureStackTrace = function (target, below) {
  if (target instanceof Error) return captureStackTrace.call(Error, target, below);
};
const root = process.env.GPUFLEET_TEST_NODE_MODULES;
const cdktf = require(path.join(root, "cdktf"));
const tokens = require(path.join(root, "cdktf", "lib", "_tokens.js"));
const { App, TerraformStack, Lazy, Token } = cdktf;
const stack = new TerraformStack(new App({ outdir: path.join(root, "..", "out") }), "s");
const JSII_OBJID = Symbol.for("$__jsii__objid__$");
function nest(depth, leaf) { let o = leaf; for (let i = 0; i < depth; i++) o = { a: o }; return o; }
const cases = {
  generated: () => ({ resource: { google_container_node_pool: { p: {
    name: "gpu", node_count: undefined, autoscaling: [{ max_node_count: 4, min_node_count: undefined }],
    node_config: [{ labels: { a: "1" }, taint: [{ key: "k", value: undefined, effect: "NO_SCHEDULE" }],
                    guest_accelerator: undefined }],
    lifecycle: undefined, count: undefined, provider: undefined, "//": { metadata: { path: "s/p" } } } } } }),
  arrays: () => ({ list: [{ a: undefined, b: 1 }, undefined, "s", [{ c: undefined }], null], empty: [undefined] }),
  nullPrototype: () => ({ o: Object.assign(Object.create(null), { a: 1, b: undefined, c: { d: undefined } }) }),
  specialKeys: () => ({ constructor: undefined, toString: undefined, resolve: undefined, _children: undefined,
                        _metadata: {}, hasOwnProperty: undefined, valueOf: 1, e2e: undefined, v1e5: undefined,
                        "kubernetes.io/name": undefined, "1": undefined, "0": 2 }),
  ownProtoKey: () => {
    const o = { x: undefined, y: 1 };
    Object.defineProperty(o, "__proto__", { value: Lazy.anyValue({ produce: () => "from a token" }),
                                            enumerable: true, writable: true, configurable: true });
    return o;
  },
  frozen: () => Object.freeze({ a: undefined, b: Object.freeze({ c: undefined, d: [Object.freeze({ e: undefined })] }) }),
  shared: () => { const s = { a: undefined, b: 1 }; return { x: s, y: s, z: [s, s] }; },
  tokens: () => ({
    s: Lazy.stringValue({ produce: () => "v" }), gone: undefined,
    n: Token.asNumber(Lazy.numberValue({ produce: () => 3 })),
    l: Token.asList(Lazy.listValue({ produce: () => ["a", "b"] })),
    inner: Lazy.anyValue({ produce: () => ({ q: undefined, r: { s: undefined, t: 2 } }) }),
    concat: `x-${Lazy.stringValue({ produce: () => "y" })}`,
  }),
  tokenKey: () => ({ [Lazy.stringValue({ produce: () => "k" })]: 1, other: undefined, m: { [Token.asString(3)]: undefined } }),
  mapToken: () => ({ m: { ...Token.asStringMap(Lazy.anyValue({ produce: () => ({ a: "b" }) })), extra: undefined } }),
  listTokenWithObject: () => ({ l: [Token.asList(Lazy.listValue({ produce: () => ["a"] }))[0], { x: undefined }] }),
  listTokenInScalar: () => ({ gone: undefined, s: { t: Token.asList(Lazy.listValue({ produce: () => ["a"] }))[0] + "", u: undefined } }),
  mapValueInScalar: () => ({ gone: undefined, k: Token.STRING_MAP_TOKEN_VALUE }),
  functionValue: () => ({ gone: undefined, n: { f: () => 1, g: undefined } }),
  nonStringKey: () => ({ gone: undefined, [Token.asString(Lazy.anyValue({ produce: () => 3 }))]: "v" }),
  depth200: () => nest(199, { x: undefined, y: 1 }),
  depth201: () => nest(200, { x: undefined }),
  cycle: () => { const o = { a: undefined, b: {} }; o.b.c = o; return o; },
  jsiiByReference: () => {
    let reads = 0;
    const o = {};
    Object.defineProperty(o, JSII_OBJID, { value: "Object@10000" });
    Object.defineProperty(o, "name", { enumerable: true, get: () => `read ${++reads}` });
    Object.defineProperty(o, "unset", { enumerable: true, get: () => undefined });
    return { value: o };
  },
  strings: () => ({ a: ["String Map Token Value", "Any Map Token Value", "1e5", "a-e2", "v1.2e", "10.0.0.0/8", "e2e",
                        "${var.x}", "$${x}", "{TfToken[", "${TfToken[", "%{ if x }y%{ endif }", "", "\u00e9\u{1F600}", "-e-"],
                    "1e5": "k", "a-e2": undefined, "${var.x}": "literal key" }),
  numbers: () => ({ a: [0, -0, 1.5, -123456789, NaN, Infinity, -Infinity, 1e300, Number.MAX_SAFE_INTEGER, undefined],
                    n: Token.asNumber(Lazy.numberValue({ produce: () => 7 })), m: -123456789 }),
  numberList: () => ({ l: Token.asNumberList(Lazy.anyValue({ produce: () => [1, 2] })), x: [1, undefined] }),
  anyMapValue: () => ({ gone: undefined, k: ["ok", "Any Map Token Value"] }),
  numberInString: () => ({ s: `n=${Token.asNumber(Lazy.numberValue({ produce: () => 5 }))}/x`, k: { [`k${Token.asNumber(Lazy.numberValue({ produce: () => 6 }))}`]: 1 } }),
  unknownNumberToken: () => ({ gone: undefined, n: Token.asNumber(Lazy.numberValue({ produce: () => 1 })) + 1 }),
  holes: () => { const a = [1, , undefined, { b: undefined }]; a[6] = "s"; return { a, nested: [[, 2], []] }; },
  exotic: () => ({ d: new Date(0), m: new Map([["a", 1]]), s: new Set([1]), b: true, f: false, sym: Symbol("s"),
                   notResolvable: { resolve: "no", x: undefined }, halfConstruct: { _children: {}, y: undefined },
                   frozenArray: Object.freeze([1, { z: undefined }]) }),
  bigint: () => ({ gone: undefined, big: 1n }),
  getters: () => {
    // getters cdktf reads (once per value, and "resolve", "_children", "_metadata" to tell tokens and constructs)
    const reads = {};
    function counted(names, enumerable) {
      const o = {};
      for (const key of names) {
        Object.defineProperty(o, key, { enumerable: enumerable.includes(key),
                                        get: () => { reads[key] = (reads[key] || 0) + 1; return key.startsWith("v") ? reads[key] : undefined; } });
      }
      return o;
    }
    return { plain: counted(["v1", "unset"], ["v1", "unset"]), token: counted(["resolve", "v2"], ["v2"]),
             construct: counted(["_children", "_metadata", "v3"], ["_children", "v3"]),
             children: counted(["_children", "v4"], ["_children", "v4"]), metadata: counted(["_metadata", "v5"], ["_metadata", "v5"]),
             get reads() { return JSON.stringify(reads); } };
  },
  // An array with an own "map", "some" or "constructor" (cdktf calls obj.some(...) and obj.map(...).filter(...),
  // and map builds its result through obj.constructor[Symbol.species]), and an Array subclass.
  arrayOwnMap: () => ({ a: Object.assign([1, 2], { map() { return ["from the array's own map"]; } }) }),
  arrayOwnSome: () => ({ a: Object.assign(["x", "y"], { some() { return true; } }) }),
  arrayConstructorNull: () => ({ a: Object.assign([1], { constructor: null }) }),
  arraySubclass: () => { class Tagged extends Array { toJSON() { return "a Tagged array"; } } return { a: Tagged.from([1, 2]) }; },
  arraySpeciesObject: () => { class S extends Array { static get [Symbol.species]() { return Object; } } return { a: S.from([1]) }; },
  // An array whose prototype is not Array.prototype has no "some" (cdktf: "xs.some is not a function").
  arrayNullPrototype: () => ({ a: Object.setPrototypeOf([1, { b: undefined }], null) }),
  arrayObjectPrototype: () => ({ a: Object.setPrototypeOf(["x"], Object.prototype) }),
  // A Lazy that appends to the array it is in: cdktf's map stops at the length it started with.
  arrayGrowsWhileResolved: () => {
    const a = [];
    a.push(Lazy.anyValue({ produce: () => { a.push("appended while resolving"); return "x"; } }), "y");
    return { a };
  },
  // (red team, second pass) An element getter that appends on its first read, i.e. during cdktf's first some():
  // cdktf's second some() and its map() each take the length anew and see the appended element.
  arrayGrowsDuringListTokenScan: () => {
    const a = [];
    let pushed = false;
    Object.defineProperty(a, 0, { enumerable: true, get: () => { if (!pushed) { pushed = true; a.push("appended while scanned"); } return "v"; } });
    return { a };
  },
  arrayGrowsListTokenDuringScan: () => {
    const a = [];
    let pushed = false;
    const listElement = Token.asList(Lazy.listValue({ produce: () => ["l"] }))[0];
    Object.defineProperty(a, 0, { enumerable: true, get: () => { if (!pushed) { pushed = true; a.push(listElement); } return "v"; } });
    return { a };
  },
  // (red team, second pass) An element getter that gives its array an own "map" during cdktf's scan: cdktf looks
  // obj.map up after its two some().
  arrayGetsOwnMapDuringScan: () => {
    const a = [];
    Object.defineProperty(a, 0, { enumerable: true, get: () => { a.map = () => ["from a map set while scanned"]; return "v"; } });
    return { a };
  },
  // The same at the element's second read (cdktf's second some), and an own "some" set at its first read (which
  // cdktf's second some then is).
  arrayGetsOwnMapAtSecondRead: () => {
    const a = [];
    let reads = 0;
    Object.defineProperty(a, 0, { enumerable: true, get: () => { if (++reads === 2) a.map = () => ["from a map set at the second read"]; return "v"; } });
    return { a };
  },
  arrayGetsOwnSomeAtFirstRead: () => {
    const a = [];
    let reads = 0;
    Object.defineProperty(a, 0, { enumerable: true, get: () => { if (++reads === 1) a.some = () => true; return 1; } });
    return { a };
  },
  // (red team, second pass) An element before an encoded list number (not a "#{TfToken[" string): cdktf reads it
  // twice (some, some); the walk reads it twice, finds the number, and cdktf reads it twice more.
  elementReadsBeforeNumberListToken: () => {
    const reads = {};
    const a = [];
    Object.defineProperty(a, 0, { enumerable: true, get: () => { reads.element = (reads.element || 0) + 1; return "v"; } });
    a.push(Token.asNumberList(Lazy.anyValue({ produce: () => [1, 2] }))[0]);
    return counting({ a }, reads);
  },
  // Reads: cdktf reads each array element three times (some, some, map), an array's "constructor" once (map's
  // species), and never the jsii tag; a getter that throws shows the extra read as an error.
  arrayElementReads: () => {
    const reads = {};
    const a = [];
    Object.defineProperty(a, 0, { enumerable: true, get: () => { reads.element = (reads.element || 0) + 1; return "v"; } });
    Object.defineProperty(a, "constructor", { get: () => { reads.ctor = (reads.ctor || 0) + 1; return Array; } });
    return counting({ a }, reads);
  },
  elementReadsBeforeListToken: () => {
    const reads = {};
    const a = [];
    Object.defineProperty(a, 0, { enumerable: true, get: () => { reads.element = (reads.element || 0) + 1; return "v"; } });
    a.push("#{TfToken[");  // no list token, but the walk's test for one (it hands the array to cdktf, which reads again)
    return counting({ a }, reads);
  },
  jsiiTagReads: () => {
    const reads = {};
    const o = { x: 1 };
    Object.defineProperty(o, JSII_OBJID, { get: () => { reads.tag = (reads.tag || 0) + 1; return undefined; } });
    return counting({ o }, reads);
  },
  jsiiTagGetterThrows: () => {
    const o = { x: 1 };
    Object.defineProperty(o, JSII_OBJID, { get: () => { throw new Error("the tag was read"); } });
    return { o };
  },
  // Proxies: cdktf asks a plain object's prototype (instanceof Date), then its keys three times (containsMapToken
  // twice, then its loop), then "resolve" and "_children"; the walk asks the prototype, reads the jsii tag, asks
  // three own descriptors, then the keys once. A revoked proxy fails on the first trap each meets.
  proxyTraps: () => {
    const log = [];
    const handler = {};
    for (const trap of ["get", "has", "ownKeys", "getPrototypeOf", "getOwnPropertyDescriptor"]) {
      handler[trap] = (...args) => { log.push(trap + (args.length > 1 ? ":" + String(args[1]) : "")); return Reflect[trap](...args); };
    }
    return counting({ p: new Proxy({ a: 1 }, handler) }, log);
  },
  proxyKeysChange: () => {
    let calls = 0;
    return { p: new Proxy({ a: 1, b: 2 }, { ownKeys: (t) => (++calls === 1 ? ["a"] : ["a", "b"]) }) };
  },
  revokedProxy: () => { const { proxy, revoke } = Proxy.revocable({}, {}); revoke(); return { p: proxy }; },
  // Stack: the stack a token's resolve has left (frames of a one-line recursion until RangeError). Under the wrapper
  // a token at the top has less (wrapped, fast, walk and cdktf's closure above cdktf's resolve, against _tokens' and
  // Tokenization's), so a resolve that just fits under cdktf overflows ("Maximum call stack size exceeded") under the
  // wrapper; a token 195 plain objects down has more.
  stackLeftAtTop: () => Lazy.anyValue({ produce: () => stackLeft() }),
  stackLeftAtDepth195: () => nest(195, Lazy.anyValue({ produce: () => stackLeft() })),
};
function stackLeft() { let n = 0; function down() { n++; down(); } try { down(); } catch { /* RangeError */ } return n; }
// An input whose non-enumerable "reads" (resolve never sees it) the harness records after resolving.
function counting(input, reads) { return Object.defineProperty(input, "reads", { get: () => JSON.stringify(reads) }); }
// Generated trees: every kind of node above mixed at random (a fixed seed, so a failure can be replayed),
// tokens whose values hold more such trees, keys that look like templates or encoded numbers.
let seed = 28;
function random() { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; }
function pick(xs) { return xs[Math.floor(random() * xs.length)]; }
const LEAVES = [() => undefined, () => null, () => true, () => 0, () => 42, () => -123456789, () => 2.5e-3, () => "plain",
  () => "with ${var.x} in it", () => "1e5", () => "String Map Token Value", () => "x-e9", () => "",
  () => Lazy.stringValue({ produce: () => "lazy" }), () => `pre-${Lazy.stringValue({ produce: () => "mid" })}-post`,
  () => Token.asNumber(Lazy.numberValue({ produce: () => 3 })), () => { const t = tree(2); return Lazy.anyValue({ produce: () => t }); },
  () => Token.asList(Lazy.listValue({ produce: () => ["p", "q"] })), () => new Date(86400000),
  () => Token.asNumberList(Lazy.anyValue({ produce: () => [1, 2] })), () => [Token.asList(Lazy.listValue({ produce: () => ["r"] }))[0], "s"],
  () => ["${TfToken[NOT.A.TOKEN]}", "#{TfToken[", 1], () => `n=${Token.asNumber(Lazy.numberValue({ produce: () => 9 }))}`];
const KEYS = ["a", "b", "name", "e2e", "v1e5", "1e5", "${x}", "kubernetes.io/name", "constructor", "0", "10", "resolve2", "_children"];
function tree(depth) {
  if (depth <= 0 || random() < 0.3) return pick(LEAVES)();
  if (random() < 0.35) { const n = Math.floor(random() * 4); const a = []; for (let i = 0; i < n; i++) a.push(tree(depth - 1)); return a; }
  const o = random() < 0.1 ? Object.create(null) : {};
  const n = Math.floor(random() * 5);
  for (let i = 0; i < n; i++) o[pick(KEYS)] = tree(depth - 1);
  return o;
}
for (let i = 0; i < 400; i++) { const made = tree(6); cases[`generated${i}`] = () => made; }
const out = { wrapped: tokens.resolve.name !== "resolve", cases: {} };
for (const [name, make] of Object.entries(cases)) {
  for (const preparing of [true, false]) {
    let result;
    const input = make();
    try { result = { ok: JSON.stringify(tokens.resolve(stack, input, preparing)) }; }
    catch (error) { result = { error: `${error.constructor.name}: ${error.message}` }; }
    if (input !== null && typeof input === "object" && "reads" in input) result.reads = input.reads;
    out.cases[`${name}/${preparing ? "preparing" : "final"}`] = result;
  }
}
fs.writeSync(1, JSON.stringify(out) + "\n");
"""


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned cdktf and constructs packages, unpacked once from the jsii assemblies the kernel loads."""
    directory = tmp_path_factory.mktemp("packages")
    for package, module in (("cdktf", cdktf), ("constructs", constructs)):
        (tarball,) = Path(module.__file__).parent.joinpath("_jsii").glob("*.jsii.tgz")
        with tarfile.open(tarball) as archive:
            archive.extractall(directory / "unpack" / package, filter="tar")
        shutil.move(directory / "unpack" / package / "package", directory / package)
    return directory


def _node_modules(directory: Path, packages: Path) -> Path:
    """A test's own ``node_modules`` (its siblings are the test's), linking the unpacked packages (Node runs with
    --preserve-symlinks, as the kernel does, so modules are known by these paths)."""
    modules = directory / "node_modules"
    modules.mkdir()
    for package in ("cdktf", "constructs"):
        (modules / package).symlink_to(packages / package)
    return modules


def _plain_and_launched(directory: Path, program_text: str, modules: Path) -> tuple[dict, dict]:
    """``program_text`` run under plain Node and under the launcher (as gpufleet's kernel starts), each one's last line."""
    launcher = jsii_runtime.write_runtime(directory / "runtime")
    assert launcher is not None
    (directory / "runtime" / jsii_runtime.PROGRAM).write_text(program_text)
    node = shutil.which("node") or "node"
    program = directory / "runtime" / jsii_runtime.PROGRAM
    return _run([node, "--preserve-symlinks", str(program)], modules), _run([node, "--preserve-symlinks", str(launcher)], modules)


def _run(argv: list[str], modules: Path) -> dict:
    done = subprocess.run(argv, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "GPUFLEET_TEST_NODE_MODULES": str(modules)})
    return json.loads(done.stdout.splitlines()[-1])


# What the walk does not reproduce (constructs_lib/jsii_runtime.py says so): a Proxy's traps (jsii's kernel and cdktf
# make no Proxy), a getter on an array element read more often when the array holds a list token marker or an
# encoded list number (the walk looks before it hands the array to cdktf, which looks again) or sets its array's own
# "some" (cdktf's second some is then that one; handed over, cdktf starts again with it), and how much
# JavaScript stack a token's resolve has left (more deep down, a few frames less at the top). Every other case,
# results, errors and reads, must match.
NOT_REPRODUCED = {"elementReadsBeforeListToken", "elementReadsBeforeNumberListToken", "arrayGetsOwnSomeAtFirstRead",
                  "proxyTraps", "proxyKeysChange", "revokedProxy", "stackLeftAtTop", "stackLeftAtDepth195"}


def test_wrapped_resolve_gives_what_cdktf_gives_for_every_edge_case(tmp_path: Path, packages: Path) -> None:
    plain, wrapped = _plain_and_launched(tmp_path, HARNESS, _node_modules(tmp_path, packages))
    assert plain["wrapped"] is False
    assert wrapped["wrapped"] is True, (
        f"cdktf {cdktf.__version__} is not the version whose resolve the launcher's wrapper was checked against "
        "(REVIEWED_CDKTF and the digests REVIEWED_FILES in constructs_lib/jsii_runtime.py): read the files named there, then name them")
    assert plain["cases"]["depth201/final"]["error"].startswith("Error: Unable to resolve")  # the limit is real
    assert "error" in plain["cases"]["cycle/final"]
    assert all("error" in plain["cases"][f"{name}/final"]
               for name in ("listTokenInScalar", "mapValueInScalar", "functionValue", "nonStringKey"))
    differing = {name: (plain["cases"][name], wrapped["cases"][name])
                 for name in plain["cases"] if plain["cases"][name] != wrapped["cases"][name]
                 and name.split("/")[0] not in NOT_REPRODUCED}
    assert differing == {}, "case: cdktf's result | the wrapper's\n" + "\n".join(
        f"{name}: {json.dumps(plain_case)} | {json.dumps(wrapped_case)}" for name, (plain_case, wrapped_case) in differing.items())


COUNTING = r"""
"use strict";
// Counts what the launcher's walk hands to cdktf's own (private) resolve: wrapped before cdktf's _tokens loads.
const fs = require("fs");
const path = require("path");
const root = process.env.GPUFLEET_TEST_NODE_MODULES;
const privateResolve = require(path.join(root, "cdktf", "lib", "tokens", "private", "resolve.js"));
const handed = [];
const original = privateResolve.resolve;
privateResolve.resolve = function (obj, options) { handed.push("/" + options.prefix.join("/")); return original.apply(this, arguments); };
const cdktf = require(path.join(root, "cdktf"));
const tokens = require(path.join(root, "cdktf", "lib", "_tokens.js"));
const older = require(path.join(root, "..", "older", "cdktf", "lib", "_tokens.js"));
const { App, TerraformStack, Lazy } = cdktf;
const stack = new TerraformStack(new App({ outdir: path.join(root, "..", "out") }), "s");
const kept = { name: "n", labels: { a: "1" } };
const input = { resource: { google_container_node_pool: { p: {
  name: "gpu", node_count: undefined, kept, autoscaling: [{ max_node_count: 4, min_node_count: undefined }],
  network: Lazy.stringValue({ produce: () => "net" }), tags: ["a", `x-${Lazy.stringValue({ produce: () => "y" })}`],
  byReference: Object.defineProperty({ name: "python" }, Symbol.for("$__jsii__objid__$"), { value: "Object@10000" }) } } } };
const before = JSON.stringify(input, (k, v) => v === undefined ? "undefined" : v);
const result = tokens.resolve(stack, input, true);
fs.writeSync(1, JSON.stringify({
  wrapped: tokens.resolve.name !== "resolve", olderWrapped: older.resolve.name !== "resolve", handed, result,
  inputUntouched: before === JSON.stringify(input, (k, v) => v === undefined ? "undefined" : v),
  fresh: result.resource.google_container_node_pool.p.kept !== kept,
}) + "\n");
"""


def test_the_walk_hands_cdktf_only_the_tokens_and_wraps_only_the_reviewed_version(tmp_path: Path, packages: Path) -> None:
    """Through the launcher, with the real cdktf: cdktf's own resolve gets the two token nodes of a generated
    resource, each with its key path, and nothing else; the result is cdktf's (compared above), made of new
    objects, the input untouched. The same cdktf package under another version number (an upgrade nobody has
    read) is left unwrapped."""
    modules = _node_modules(tmp_path, packages)
    older = tmp_path / "older" / "cdktf"
    shutil.copytree(modules / "cdktf", older)
    manifest = json.loads((older / "package.json").read_text())
    (older / "package.json").write_text(json.dumps(manifest | {"version": "0.22.0"}))
    (tmp_path / "older" / "constructs").symlink_to(modules / "constructs")
    launcher = jsii_runtime.write_runtime(tmp_path / "runtime")
    assert launcher is not None
    (tmp_path / "runtime" / jsii_runtime.PROGRAM).write_text(COUNTING)
    out = _run([shutil.which("node") or "node", "--preserve-symlinks", str(launcher)], modules)
    assert out["wrapped"] is True and out["olderWrapped"] is False
    assert out["handed"] == ["/resource/google_container_node_pool/p/network", "/resource/google_container_node_pool/p/tags/1",
                             "/resource/google_container_node_pool/p/byReference"]  # the kernel's: its getters call Python
    assert out["result"] == {"resource": {"google_container_node_pool": {"p": {
        "name": "gpu", "kept": {"name": "n", "labels": {"a": "1"}}, "autoscaling": [{"max_node_count": 4}],
        "network": "net", "tags": ["a", "x-y"], "byReference": {"name": "python"}}}}}
    assert out["inputUntouched"] is True and out["fresh"] is True


ODD_PACKAGES = r"""
"use strict";
// Loads a directory named cdktf whose lib/_tokens.js exports null, a "./_tokens" required by a module without a
// filename, and a cdktf that says it is 0.21.0 but whose resolve.js keeps an array's undefined elements as null (a
// patch-package style change).
const fs = require("fs");
const path = require("path");
const root = process.env.GPUFLEET_TEST_NODE_MODULES;
const out = {};
try { out.nullExports = JSON.stringify(require(path.join(root, "..", "odd", "cdktf"))); }
catch (error) { out.nullExports = `${error.constructor.name}: ${error.message}`; }
// A module made by hand has no filename (the hook must not take path.dirname of it).
process.chdir(path.join(root, "..", "nameless"));
try { out.namelessParent = JSON.stringify(new (require("module"))("made by hand", null).require("./_tokens")); }
catch (error) { out.namelessParent = `${error.constructor.name}: ${error.message}`; }
const patched = path.join(root, "..", "patched", "cdktf");
const cdktf = require(patched);
const tokens = require(path.join(patched, "lib", "_tokens.js"));
const stack = new cdktf.TerraformStack(new cdktf.App({ outdir: path.join(root, "..", "out") }), "s");
out.patchedResult = JSON.stringify(tokens.resolve(stack, { a: [1, undefined] }));
fs.writeSync(1, JSON.stringify(out) + "\n");
"""


def test_the_launcher_loads_odd_cdktf_directories_as_node_does(tmp_path: Path, packages: Path) -> None:
    """A directory named cdktf that is not cdktf, and a cdktf 0.21.0 whose resolve.js was patched: each loads and
    resolves under the launcher as under plain Node: the hook looks at what a ``./_tokens`` exports before it reads
    it, and wraps only a cdktf whose seven files the walk relies on have the reviewed digests, not one that only says
    0.21.0."""
    modules = _node_modules(tmp_path, packages)
    odd = tmp_path / "odd" / "cdktf"
    (odd / "lib").mkdir(parents=True)
    (odd / "package.json").write_text(json.dumps({"name": "cdktf", "version": "0.21.0", "main": "lib/index.js"}))
    (odd / "lib" / "index.js").write_text('module.exports = { tokens: require("./_tokens") };\n')
    (odd / "lib" / "_tokens.js").write_text("module.exports = null;\n")
    (tmp_path / "nameless").mkdir()
    (tmp_path / "nameless" / "_tokens.js").write_text("module.exports = { nameless: true };\n")
    patched = tmp_path / "patched" / "cdktf"
    shutil.copytree(modules / "cdktf", patched)
    (tmp_path / "patched" / "constructs").symlink_to(modules / "constructs")
    resolve_js = patched / "lib" / "tokens" / "private" / "resolve.js"
    text = resolve_js.read_text()
    assert text.count('.filter((x) => typeof x !== "undefined")') == 1
    resolve_js.write_text(text.replace('.filter((x) => typeof x !== "undefined")', '.map((x) => (x === undefined ? null : x))'))
    plain, wrapped = _plain_and_launched(tmp_path, ODD_PACKAGES, modules)
    assert plain == {"nullExports": '{"tokens":null}', "namelessParent": '{"nameless":true}', "patchedResult": '{"a":[1,null]}'}
    assert wrapped == plain


CHANGED_AFTER_LOAD = r"""
"use strict";
// cdktf's _tokens.resolve looks up Tokenization.resolve, and resolve.js the Token sentinels, at each call.
const fs = require("fs");
const path = require("path");
const root = process.env.GPUFLEET_TEST_NODE_MODULES;
const cdktf = require(path.join(root, "cdktf"));
const tokens = require(path.join(root, "cdktf", "lib", "_tokens.js"));
const stack = new cdktf.TerraformStack(new cdktf.App({ outdir: path.join(root, "..", "out") }), "s");
const out = {};
const original = cdktf.Tokenization.resolve;
let calls = 0;
cdktf.Tokenization.resolve = function () { calls++; return original.apply(this, arguments); };
tokens.resolve(stack, { a: 1 });
out.tokenizationResolveCalls = calls;
cdktf.Token.STRING_MAP_TOKEN_VALUE = "a changed sentinel";
try { out.changedSentinel = JSON.stringify(tokens.resolve(stack, { a: "a changed sentinel" })); }
catch (error) { out.changedSentinel = `${error.constructor.name}: ${error.message.split("\n")[0]}`; }
fs.writeSync(1, JSON.stringify(out) + "\n");
"""


def test_the_wrapper_follows_what_cdktf_looks_up_at_each_call(tmp_path: Path, packages: Path) -> None:
    """Tokenization.resolve replaced, or Token.STRING_MAP_TOKEN_VALUE changed, after cdktf loaded: cdktf's resolve
    follows, and so does the wrapper (a replaced Tokenization.resolve turns the walk off; the map-token values are
    read at each call)."""
    plain, wrapped = _plain_and_launched(tmp_path, CHANGED_AFTER_LOAD, _node_modules(tmp_path, packages))
    assert plain == {"tokenizationResolveCalls": 1,
                     "changedSentinel": "Error: Found an encoded map token in a scalar string context."}
    assert wrapped == plain


APP = r"""
"use strict";
// A two-stack app synthesized by cdktf itself: variables, locals with escapes and encoded-number-like text, a
// for_each iterator, Fn functions, operators and conditionals, Lazy values (omitEmpty), overrides, and a
// cross-stack reference (an output in one stack, a remote state in the other). Prints every file it wrote.
const fs = require("fs");
const path = require("path");
const root = process.env.GPUFLEET_TEST_NODE_MODULES;
const cdktf = require(path.join(root, "cdktf"));
const tokens = require(path.join(root, "cdktf", "lib", "_tokens.js"));
const { App, TerraformStack, TerraformVariable, TerraformLocal, TerraformOutput, DataResource, TerraformIterator,
        Fn, Op, Lazy, conditional, propertyAccess } = cdktf;
const outdir = path.join(root, "..", "app-out");
const app = new App({ outdir, skipValidation: true });  // its validation runs `terraform version`, not on this PATH
const a = new TerraformStack(app, "a");
const b = new TerraformStack(app, "b");
const name = new TerraformVariable(a, "name", { type: "string", default: "gpu" });
const local = new TerraformLocal(a, "l", { plain: "x", escaped: "$${not.a.ref}", numberish: "1e5", unset: undefined,
                                          nested: { list: [1, undefined, "s"], empty: Lazy.anyValue({ produce: () => [] }, { omitEmptyArray: true }) } });
const it = TerraformIterator.fromList(["p", "q"]);
const each = new DataResource(a, "each", { forEach: it, input: { key: it.value, joined: Fn.join("-", [name.stringValue, it.value]) } });
const data = new DataResource(a, "d", { input: { sum: Op.add(1, 2), pick: conditional(true, "y", "n"),
                                                 looked: Fn.lookup(local.asAnyMap, "plain", "none"), at: propertyAccess(local.expression, ["nested", "list"]) } });
data.addOverride("input.extra", { k: "v", gone: undefined });
new DataResource(b, "uses", { input: { from_a: data.output, count: each.fqn } });
new TerraformOutput(a, "o", { value: data.id });
app.synth();
const files = {};
for (const dir of fs.readdirSync(path.join(outdir, "stacks")).sort()) {
  files[dir] = fs.readFileSync(path.join(outdir, "stacks", dir, "cdk.tf.json"), "utf8");
}
fs.writeSync(1, JSON.stringify({ wrapped: tokens.resolve.name !== "resolve", files }) + "\n");
"""


def test_a_cdktf_app_synthesizes_the_same_bytes_with_the_walk(tmp_path: Path, packages: Path) -> None:
    """cdktf's own synthesis of a two-stack app (iterators, Fn, operators, Lazy, overrides, a cross-stack reference)
    under plain Node and under the launcher: the same files, byte for byte, with the walk in use."""
    plain, wrapped = _plain_and_launched(tmp_path, APP, _node_modules(tmp_path, packages))
    assert plain["wrapped"] is False and wrapped["wrapped"] is True
    assert "terraform_remote_state" in plain["files"]["b"] and "for_each" in plain["files"]["a"]
    assert wrapped["files"] == plain["files"]


# Synthesizes one stack of escape hatches and Python-made values through the real jsii kernel (started
# as gpufleet starts it unless GPUFLEET_JSII_RUNTIME=packaged) and prints its Terraform JSON.
KERNEL_CHILD = r'''
import sys
from constructs_lib.jsii_runtime import direct_kernel
with direct_kernel():
    import jsii
    from cdktf import App, DataResource, Fn, IResolvable, TerraformLocal, TerraformOutput, TerraformStack

@jsii.implements(IResolvable)
class Resolvable:
    creation_stack = []
    def resolve(self, context):
        return {"set": "v", "unset": None, "nested": [{"unset": None, "n": 1}]}
    def to_string(self):
        return "resolvable"

app = App(outdir=sys.argv[1])
stack = TerraformStack(app, "edges")
data = DataResource(stack, "d", input={"a": None, "b": [None, {"c": None, "constructor": 1}], "e2e": None},
                    triggers_replace={"x": "y", "unset": None})
data.add_override("input.removed", None)
data.add_override("input.deep.constructor", {"toString": None, "valueOf": 2, "resolve": None})
data.add_override("input.list", [{"unset": None, "set": 1}, None])
data.add_override("lifecycle.create_before_destroy", None)
data.add_override("triggers_replace", None)
local = TerraformLocal(stack, "l", {"m": {"unset": None, "k": "v"}})
TerraformOutput(stack, "o", value={"unset": None, "r": Resolvable(), "lookup": Fn.lookup(local.as_any_map, "m", None)})
TerraformOutput(stack, "gone", value="x")
stack.add_override("output.gone", None)
stack.add_override("output.o.sensitive", None)
stack.add_override("terraform.required_version", ">= 1.11")
print(app.synth() or "")
'''


def test_kernel_synthesizes_escape_hatches_the_same_with_and_without_the_wrapper(tmp_path: Path) -> None:
    """The same stack of overrides that delete keys (a None value), nested override maps with keys such as
    ``constructor``, Python lists and maps holding None, a Python-made IResolvable and map lookups, synthesized
    through the real kernel under gpufleet's launcher and under jsii's packaged entry point: the same bytes."""
    import os
    import sys

    outputs = {}
    for runtime in ("", "packaged"):
        out = tmp_path / (runtime or "launcher")
        env = {k: v for k, v in os.environ.items() if k not in ("JSII_RUNTIME", "NODE_OPTIONS")} | {
            "GPUFLEET_JSII_RUNTIME": runtime}
        subprocess.run([sys.executable, "-c", KERNEL_CHILD, str(out)], cwd=Path(__file__).resolve().parents[2],
                       env=env, check=True, capture_output=True, text=True, timeout=300)
        outputs[runtime] = (out / "stacks" / "edges" / "cdk.tf.json").read_bytes()
    document = json.loads(outputs[""])
    assert "gone" not in document["output"] and "removed" not in document["resource"]["terraform_data"]["d"]["input"]
    assert outputs[""] == outputs["packaged"]


ENVIRONMENT = r"""
"use strict";
// (red team, second pass) What the wrapper's walk takes from cdktf's modules and from Object.prototype, changed
// after cdktf loaded, each change undone before the next.
const fs = require("fs");
const path = require("path");
const root = process.env.GPUFLEET_TEST_NODE_MODULES;
const cdktf = require(path.join(root, "cdktf"));
const tokens = require(path.join(root, "cdktf", "lib", "_tokens.js"));
const resolveJs = require(path.join(root, "cdktf", "lib", "tokens", "private", "resolve.js"));
const encoding = require(path.join(root, "cdktf", "lib", "tokens", "private", "encoding.js"));
const { Lazy, Token } = cdktf;
const stack = new cdktf.TerraformStack(new cdktf.App({ outdir: path.join(root, "..", "out") }), "s");
const out = {};
function attempt(name, make) {
  try { out[name] = JSON.stringify(tokens.resolve(stack, make())); }
  catch (error) { out[name] = `${error.constructor.name}: ${error.message.split("\n")[0]}`; }
}
// resolve.js's export replaced (instrumentation, a patch at run time): Tokenization.resolve calls it once, at the
// root, token or not (the walk, which hands over nodes one by one, must step aside).
const original = resolveJs.resolve;
let calls = 0;
resolveJs.resolve = function (obj, options) {
  calls++;
  const result = original.apply(this, arguments);
  return typeof result === "string" ? result.toUpperCase() : result;
};
attempt("resolveExportReplaced", () => ({ a: "x", t: Lazy.stringValue({ produce: () => "y" }) }));
attempt("resolveExportReplacedNoToken", () => ({ a: "x" }));
out.resolveExportCalls = calls;
resolveJs.resolve = original;
// encoding.js's export replaced: resolve.js's containsNumberListTokenElement calls encoding.js's own function.
const extract = encoding.extractTokenDouble;
encoding.extractTokenDouble = (x, list) => (list ? undefined : extract(x, list));
attempt("extractExportReplaced", () => ({ l: Token.asNumberList(Lazy.anyValue({ produce: () => [1, 2] })) }));
encoding.extractTokenDouble = extract;
// Object.prototype with "_children" and "_metadata" (resolve.js's isConstruct reads them, inherited or not).
for (const key of ["_children", "_metadata"]) Object.defineProperty(Object.prototype, key, { value: {}, configurable: true });
attempt("prototypeConstruct", () => ({ a: { b: 1 } }));
for (const key of ["_children", "_metadata"]) delete Object.prototype[key];
// Object.prototype with a "resolve" function: every object is then a token to resolve.js.
Object.defineProperty(Object.prototype, "resolve", { value: () => "every object a token", configurable: true, writable: true });
attempt("prototypeResolvable", () => ({ a: { b: 1 } }));
delete Object.prototype.resolve;
// A token that changes Token.STRING_MAP_TOKEN_VALUE while the tree is resolved: resolve.js reads it at each string
// (a later sibling string equal to the new value).
const sentinel = Token.STRING_MAP_TOKEN_VALUE;
attempt("sentinelChangedMidWalk", () => ({ a: Lazy.anyValue({ produce: () => { Token.STRING_MAP_TOKEN_VALUE = "changed mid-walk"; return 1; } }),
                                           b: "changed mid-walk" }));
Token.STRING_MAP_TOKEN_VALUE = sentinel;
fs.writeSync(1, JSON.stringify(out) + "\n");
"""


def test_the_wrapper_follows_cdktf_when_its_modules_or_object_prototype_change(tmp_path: Path, packages: Path) -> None:
    """(red team, second pass) resolve.js's or encoding.js's export replaced after cdktf loaded, an Object.prototype
    with a construct's "_children"/"_metadata" or a token's "resolve", and a token that changes a map-token value in
    the middle of a walk: the launcher resolves as plain Node does."""
    plain, wrapped = _plain_and_launched(tmp_path, ENVIRONMENT, _node_modules(tmp_path, packages))
    assert "prototypeResolvable" in plain and "prototypeConstruct" in plain
    assert {k: (plain[k], wrapped.get(k)) for k in plain if plain[k] != wrapped.get(k)} == {}
