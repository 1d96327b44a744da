"""The launcher's wrapper around cdktf's module-level ``resolve`` (constructs_lib/jsii_runtime.py) against
the real cdktf this repository pins, not a stand-in: the same script resolves the same inputs through
``cdktf/lib/_tokens.js`` once under plain Node (cdktf's own ``resolve``) and once under the launcher (the
wrapped one), and every result or error message must be the same.

The inputs are built in JavaScript so that they can hold what cdktf may meet but Python cannot send:
tokens of every kind (string, number, list, map, a token as a key), null-prototype and frozen objects,
objects shared twice, keys such as ``constructor``/``resolve``/``_children``, an own ``__proto__`` key,
undefined values at cdktf's depth limit (``prefix.length > 200`` in ``lib/tokens/private/resolve.js`` of
cdktf 0.21.0 throws before it looks at the value), a cycle, and an object the jsii kernel tags as passed
by reference (its properties are getters that call back into Python). On a cdktf upgrade this runs on
the new version, so a change in how cdktf treats any of these shows up here."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import cdktf
import constructs

from constructs_lib import jsii_runtime

HARNESS = r"""
"use strict";
const fs = require("fs");
const path = require("path");
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
};
const out = { wrapped: tokens.resolve.name !== "resolve", cases: {} };
for (const [name, make] of Object.entries(cases)) {
  for (const preparing of [true, false]) {
    let result;
    try { result = { ok: JSON.stringify(tokens.resolve(stack, make(), preparing)) }; }
    catch (error) { result = { error: `${error.constructor.name}: ${error.message}` }; }
    out.cases[`${name}/${preparing ? "preparing" : "final"}`] = result;
  }
}
fs.writeSync(1, JSON.stringify(out) + "\n");
"""


def _node_modules(directory: Path) -> Path:
    """The pinned cdktf and constructs packages, unpacked from the jsii assemblies the kernel loads."""
    modules = directory / "node_modules"
    for package, module in (("cdktf", cdktf), ("constructs", constructs)):
        (tarball,) = Path(module.__file__).parent.joinpath("_jsii").glob("*.jsii.tgz")
        with tarfile.open(tarball) as archive:
            archive.extractall(directory / "unpack" / package, filter="tar")
        shutil.move(directory / "unpack" / package / "package", modules / package)
    return modules


def _run(argv: list[str], modules: Path) -> dict:
    done = subprocess.run(argv, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "GPUFLEET_TEST_NODE_MODULES": str(modules)})
    return json.loads(done.stdout.splitlines()[-1])


def test_wrapped_resolve_gives_what_cdktf_gives_for_every_edge_case(tmp_path: Path) -> None:
    modules = _node_modules(tmp_path)
    launcher = jsii_runtime.write_runtime(tmp_path / "runtime")
    assert launcher is not None
    program = tmp_path / "runtime" / jsii_runtime.PROGRAM
    program.write_text(HARNESS)
    node = shutil.which("node") or "node"
    plain = _run([node, "--preserve-symlinks", str(program)], modules)
    wrapped = _run([node, "--preserve-symlinks", str(launcher)], modules)
    assert plain["wrapped"] is False
    assert wrapped["wrapped"] is True, (
        f"cdktf {cdktf.__version__} is not the version whose resolve the launcher's wrapper was checked against "
        "(REVIEWED_CDKTF in constructs_lib/jsii_runtime.py): read its lib/tokens/private/resolve.js, then name it there")
    assert plain["cases"]["depth201/final"]["error"].startswith("Error: Unable to resolve")  # the limit is real
    assert "error" in plain["cases"]["cycle/final"]
    assert all("error" in plain["cases"][f"{name}/final"]
               for name in ("listTokenInScalar", "mapValueInScalar", "functionValue", "nonStringKey"))
    differing = {name: (plain["cases"][name], wrapped["cases"][name])
                 for name in plain["cases"] if plain["cases"][name] != wrapped["cases"][name]}
    assert differing == {}


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
