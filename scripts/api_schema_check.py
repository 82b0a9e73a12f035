#!/usr/bin/env python3
"""Checks broca's request bodies against the request definitions the providers publish in their
own packages (installed from PyPI by scripts/api-schema-check), not against our own reading.

Usage: api_schema_check.py [--exceptions FILE] DIR_OR_FILE...

Every file named `request.<family>.<case>.json` (found recursively under a directory) is one
request body; <family> picks the published definition:

  anthropic_messages        anthropic SDK: anthropic.types.message_create_params.MessageCreateParamsStreaming
  openai_chat               openai SDK: openai.types.chat.completion_create_params.CompletionCreateParamsStreaming
  openai_responses          openai SDK: openai.types.responses.response_create_params.ResponseCreateParamsStreaming
  openai_chatgpt_responses  the same Responses type (the ChatGPT/Codex backend takes Responses bodies)
  google_generate_content   google-api-python-client's Vertex AI discovery document
                            (aiplatform.v1beta1.json): GoogleCloudAiplatformV1beta1GenerateContentRequest
  google_code_assist        the same schema for the envelope's `request`; the envelope itself is
                            published in no package: its members are listed in the exceptions file
  aws_bedrock_converse      botocore's Bedrock Runtime service model (bedrock-runtime/<date>/
                            service-2.json.gz): the body members of the ConverseStreamRequest shape

A finding is a path in the body (`$.messages[1].content[0].id`), a kind (extra, missing, type,
enum, union, constraint, readonly) and the published type it was found in. A finding that a known
exception (testdata/api-schema/exceptions.json) names is allowed and counted under its name;
every other finding is a violation, printed as `VIOLATION <request> <path> <kind> [<type>]: <why>`.
The last line is `API-SCHEMA requests=<n> violations=<n>` (then one `ALLOWED <name> <count>` per
exception used, and `UNUSED-EXCEPTION <name>` for those no request needed). Exit 1 on any
violation, 0 otherwise.
"""

import binascii
import collections.abc
import fnmatch
import glob
import gzip
import json
import os
import re
import sys
import types
import typing

import typing_extensions

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_EXCEPTIONS = os.path.join(HERE, "..", "testdata", "api-schema", "exceptions.json")

KINDS = ("extra", "missing", "type", "enum", "union", "constraint", "readonly")


class Finding:
    __slots__ = ("path", "kind", "where", "why", "value", "allowed_by")

    def __init__(self, path, kind, where, why, value=None):
        self.path, self.kind, self.where, self.why, self.value, self.allowed_by = path, kind, where, why, value, None

    def __repr__(self):
        return f"{self.path} {self.kind} [{self.where}]: {self.why}"


def star(path):
    """`$.input[3].content[0]` -> `$.input[*].content[*]`: the form exception patterns use."""
    return re.sub(r"\[\d+\]", "[*]", path)


def json_type(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def is_base64(text):
    """Strict RFC 4648 base64, padded; proto3 JSON also takes the URL-safe alphabet."""
    text = text.replace("-", "+").replace("_", "/")
    if len(text) % 4:
        return False
    try:
        binascii.a2b_base64(text.encode("ascii"), strict_mode=True)
        return True
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return False


def path_matches(path, pattern):
    """`path` (indices starred) against `pattern`: `[*]` is literal there, another `*` any text."""
    parts = [re.escape(p).replace(r"\*", ".*") for p in pattern.split("[*]")]
    return re.fullmatch(r"\[\*\]".join(parts), path) is not None


class Exceptions:
    """The known differences between a published definition and the live API, allowed by name."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        self.entries = data["exceptions"]
        for e in self.entries:
            for key in ("name", "families", "path", "kind", "published", "live", "why"):
                if key not in e:
                    raise SystemExit(f"api-schema: exception {e.get('name', '?')} has no {key!r}")
            if e["kind"] not in KINDS:
                raise SystemExit(f"api-schema: exception {e['name']}: unknown kind {e['kind']!r}")
        self.code_assist_envelope = data["code_assist_envelope"]
        self.used = collections.Counter()

    def match(self, family, request, finding):
        path = star(finding.path)
        for e in self.entries:
            if not any(fnmatch.fnmatchcase(family, f) for f in e["families"]):
                continue
            if "requests" in e and not any(fnmatch.fnmatchcase(request, r) for r in e["requests"]):
                continue
            if e["kind"] != finding.kind or not path_matches(path, e["path"]):
                continue
            if "in" in e and e["in"] != finding.where:
                continue
            if "values" in e and finding.value not in e["values"]:
                continue
            return e["name"]
        return None


class Context:
    """One request being checked: where exceptions are looked up while unions are resolved."""

    def __init__(self, family, request, exceptions):
        self.family, self.request, self.exceptions = family, request, exceptions

    def mark(self, findings):
        """Marks the findings an exception allows; returns the number still open."""
        open_count = 0
        for f in findings:
            if f.allowed_by is None:
                f.allowed_by = self.exceptions.match(self.family, self.request, f)
            if f.allowed_by is None:
                open_count += 1
        return open_count


# ---- OpenAI and Anthropic: the SDKs' request TypedDicts --------------------------------------
#
# The SDKs publish each request body as a TypedDict (total=False, `Required[...]` members). A
# TypedDict accepts extra keys and pydantic's TypeAdapter does not look inside `Iterable[...]`
# members (it validates them lazily), so this walks the value against the TypedDict's resolved
# annotations itself: an unknown member is `extra`, a Required one absent is `missing`, a value of
# another JSON type is `type`, a string outside a Literal is `enum`. A Union is met when one
# alternative meets it with no open finding (findings an exception allows do not count).
# pydantic's TypeAdapter then validates the same body as a cross-check of this walk (see
# `check_typed`).


class TypedWalker:
    def __init__(self, ctx):
        self.ctx = ctx
        self.hints = {}

    def hints_of(self, td):
        if td not in self.hints and hasattr(td, "model_fields"):  # a pydantic model: its fields by alias
            fields = {(f.alias or k): f for k, f in td.model_fields.items()}
            self.hints[td] = ({k: f.annotation for k, f in fields.items()},
                              {k for k, f in fields.items() if f.is_required()})
        if td not in self.hints:
            hints = typing.get_type_hints(td, include_extras=True)
            required = set()
            for key, hint in hints.items():
                origin = typing.get_origin(hint)
                if origin in (typing.Required, typing_extensions.Required):
                    required.add(key)
                elif origin in (typing.NotRequired, typing_extensions.NotRequired):
                    pass
                elif key in td.__required_keys__:
                    required.add(key)
            self.hints[td] = (hints, required)
        return self.hints[td]

    @staticmethod
    def name(tp):
        return getattr(tp, "__name__", None) or str(tp).replace("typing.", "").replace("typing_extensions.", "")

    def unwrap(self, tp):
        while True:
            origin = typing.get_origin(tp)
            if origin in (typing.Required, typing.NotRequired, typing_extensions.Required,
                          typing_extensions.NotRequired, typing_extensions.ReadOnly, typing.Annotated):
                tp = typing.get_args(tp)[0]
                continue
            if isinstance(tp, typing_extensions.TypeAliasType):
                tp = tp.__value__
                continue
            return tp

    def check(self, value, tp, path, where):
        tp = self.unwrap(tp)
        origin = typing.get_origin(tp)
        if tp in (typing.Any, object):
            return []
        if tp is type(None):
            return [] if value is None else [Finding(path, "type", where, f"expected null, got {json_type(value)}")]
        if tp is str:
            return [] if isinstance(value, str) else [Finding(path, "type", where, f"expected string, got {json_type(value)}")]
        if tp is bool:
            return [] if isinstance(value, bool) else [Finding(path, "type", where, f"expected boolean, got {json_type(value)}")]
        if tp is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
            return [] if ok else [Finding(path, "type", where, f"expected integer, got {json_type(value)}")]
        if tp is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return [] if ok else [Finding(path, "type", where, f"expected number, got {json_type(value)}")]
        if origin in (typing.Literal, typing_extensions.Literal):
            allowed = typing.get_args(tp)
            if value in allowed and type(value) in {type(a) for a in allowed}:
                return []
            return [Finding(path, "enum", where, f"{json.dumps(value)[:60]} is not one of {list(allowed)}", value)]
        if origin in (typing.Union, types.UnionType):
            return self.union(value, typing.get_args(tp), path, where)
        if typing_extensions.is_typeddict(tp):
            return self.typed_dict(value, tp, path)
        if isinstance(tp, type) and hasattr(tp, "model_fields"):
            return self.typed_dict(value, tp, path)  # a response model the SDK also takes as input
        if origin in (list, collections.abc.Iterable, collections.abc.Sequence, typing.List) or \
                getattr(origin, "__name__", "") == "SequenceNotStr" or getattr(tp, "__name__", "") == "SequenceNotStr":
            if not isinstance(value, list):
                return [Finding(path, "type", where, f"expected array, got {json_type(value)}")]
            args = typing.get_args(tp)
            item = args[0] if args else typing.Any
            out = []
            for i, v in enumerate(value):
                out += self.check(v, item, f"{path}[{i}]", where)
            return out
        if origin in (dict, collections.abc.Mapping, typing.Dict):
            if not isinstance(value, dict):
                return [Finding(path, "type", where, f"expected object, got {json_type(value)}")]
            args = typing.get_args(tp)
            out = []
            if len(args) == 2:
                for k, v in value.items():
                    out += self.check(v, args[1], f"{path}.{k}", where)
            return out
        if tp in (dict,):
            return [] if isinstance(value, dict) else [Finding(path, "type", where, f"expected object, got {json_type(value)}")]
        raise SystemExit(f"api-schema: no rule for the published type {tp!r} at {path}")

    def typed_dict(self, value, td, path):
        name = td.__name__
        if not isinstance(value, dict):
            return [Finding(path, "type", name, f"expected object, got {json_type(value)}")]
        hints, required = self.hints_of(td)
        out = []
        for key, v in value.items():
            if key not in hints:
                out.append(Finding(f"{path}.{key}", "extra", name, f"{name} has no member {key!r}"))
            else:
                out += self.check(v, hints[key], f"{path}.{key}", name)
        for key in sorted(required - value.keys()):
            out.append(Finding(f"{path}.{key}", "missing", name, f"{name} requires {key!r}"))
        return out

    def discriminated_out(self, value, alt):
        """Whether a TypedDict alternative is ruled out by a Literal member the value has."""
        if not (isinstance(value, dict) and (typing_extensions.is_typeddict(alt) or hasattr(alt, "model_fields"))):
            return False
        hints, _ = self.hints_of(alt)
        for key in ("type", "role"):  # the members the SDKs discriminate their unions on
            if key not in hints or key not in value:
                continue
            hint = self.unwrap(hints[key])
            alts = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
            alts = [a for a in alts if a is not type(None)]
            if alts and all(typing.get_origin(a) in (typing.Literal, typing_extensions.Literal) for a in alts):
                if value[key] not in [v for a in alts for v in typing.get_args(a)]:
                    return True
        return False

    def union(self, value, alternatives, path, where):
        candidates = [a for a in alternatives if not self.discriminated_out(value, a)] or list(alternatives)
        best = None
        for alt in candidates:
            findings = self.check(value, alt, path, where)
            open_count = self.ctx.mark(findings)
            if open_count == 0:
                return findings  # met; the allowed findings travel up to be counted
            # The closest alternative: one of the value's own JSON type first, then fewest open.
            rank = (any(f.path == path and f.kind == "type" for f in findings), open_count)
            if best is None or rank < best[0]:
                best = (rank, alt, findings)
        _, alt, findings = best
        names = ", ".join(self.name(a) for a in candidates)
        for f in findings:
            if f.allowed_by is None and "(no alternative of" not in f.why:  # the innermost union says it
                f.why += f" (no alternative of [{names}] matches; closest: {self.name(alt)})"
        return findings


def load_typed(family):
    if family == "anthropic_messages":
        from anthropic.types.message_create_params import MessageCreateParamsStreaming as T
    elif family == "openai_chat":
        from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming as T
    else:
        from openai.types.responses.response_create_params import ResponseCreateParamsStreaming as T
    return T


_adapters = {}


def check_typed(ctx, body):
    T = load_typed(ctx.family)
    findings = TypedWalker(ctx).typed_dict(body, T, "$")
    ctx.mark(findings)
    # Cross-check with pydantic: a body pydantic refuses must have at least one finding here
    # (allowed or not), or this walk missed something.
    import pydantic
    if T not in _adapters:
        _adapters[T] = pydantic.TypeAdapter(T)
    try:
        _adapters[T].validate_python(body)
    except pydantic.ValidationError as e:
        if not findings:
            err = e.errors()[0]
            loc = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            findings.append(Finding(loc, "type", T.__name__,
                                    f"pydantic's TypeAdapter refuses what the walk accepts: {err['msg']}"))
    return findings


# ---- Gemini and Code Assist: the Vertex AI discovery document --------------------------------
#
# google-api-python-client ships Google's discovery documents; aiplatform.v1beta1.json describes
# GoogleCloudAiplatformV1beta1GenerateContentRequest (the Gemini API's generateContent body has
# the same shape). Discovery schemas are JSON-schema-like: `type` (object, array, string,
# integer, number, boolean, any), `properties`, `additionalProperties` (a map), `items`, `$ref`,
# `enum`, `format` (int64 and uint64 travel as strings or numbers, byte as base64), `readOnly`
# (output only: sending it is a finding). Discovery has no `required`; a member whose description
# starts "Required." is treated as required. `type: any` (protobuf Struct/Value: function args,
# responses, parametersJsonSchema) accepts any JSON.


class DiscoveryWalker:
    def __init__(self, doc):
        self.schemas = doc["schemas"]

    def check(self, value, schema, path, where):
        if "$ref" in schema:
            name = schema["$ref"]
            return self.check(value, self.schemas[name], path, name.removeprefix("GoogleCloudAiplatformV1beta1"))
        kind = schema.get("type")
        if kind == "any":
            return []
        if kind == "object":
            if not isinstance(value, dict):
                return [Finding(path, "type", where, f"expected object, got {json_type(value)}")]
            out = []
            props = schema.get("properties")
            extra = schema.get("additionalProperties")
            for key, v in value.items():
                if props is not None and key in props:
                    prop = props[key]
                    if prop.get("readOnly"):
                        out.append(Finding(f"{path}.{key}", "readonly", where, f"{where}.{key} is output only"))
                    out += self.check(v, prop, f"{path}.{key}", where)
                elif extra is not None:
                    out += self.check(v, extra, f"{path}.{key}", where)
                else:
                    out.append(Finding(f"{path}.{key}", "extra", where, f"{where} has no member {key!r}"))
            for key, prop in (props or {}).items():
                if key not in value and prop.get("description", "").startswith("Required."):
                    out.append(Finding(f"{path}.{key}", "missing", where, f"{where}.{key} is described 'Required.'"))
            return out
        if kind == "array":
            if not isinstance(value, list):
                return [Finding(path, "type", where, f"expected array, got {json_type(value)}")]
            out = []
            for i, v in enumerate(value):
                out += self.check(v, schema["items"], f"{path}[{i}]", where)
            return out
        if kind == "string":
            if not isinstance(value, str):
                return [Finding(path, "type", where, f"expected string, got {json_type(value)}")]
            fmt = schema.get("format")
            if "enum" in schema and value not in schema["enum"]:
                return [Finding(path, "enum", where, f"{value!r} is not one of {schema['enum']}", value)]
            if fmt in ("int64", "uint64") and not re.fullmatch(r"-?\d+", value):
                return [Finding(path, "type", where, f"{value!r} is not an {fmt}")]
            if fmt == "byte" and not is_base64(value):
                return [Finding(path, "constraint", where, f"{value[:40]!r} is not base64 (format byte)", value)]
            return []
        if kind == "integer":
            ok = isinstance(value, int) and not isinstance(value, bool) or \
                isinstance(value, str) and re.fullmatch(r"-?\d+", value) is not None
            return [] if ok else [Finding(path, "type", where, f"expected integer, got {json_type(value)}")]
        if kind == "number":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return [] if ok else [Finding(path, "type", where, f"expected number, got {json_type(value)}")]
        if kind == "boolean":
            return [] if isinstance(value, bool) else [Finding(path, "type", where, f"expected boolean, got {json_type(value)}")]
        raise SystemExit(f"api-schema: no rule for the discovery schema {schema!r} at {path}")


def load_discovery():
    import googleapiclient
    path = os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "aiplatform.v1beta1.json")
    with open(path, encoding="utf-8") as f:
        return DiscoveryWalker(json.load(f))


REQUEST_SCHEMA = {"$ref": "GoogleCloudAiplatformV1beta1GenerateContentRequest"}


def check_gemini(ctx, body, walker):
    findings = walker.check(body, REQUEST_SCHEMA, "$", "GenerateContentRequest")
    ctx.mark(findings)
    return findings


def check_code_assist(ctx, body, walker, envelope):
    """The Code Assist envelope: its members are the exceptions file's `code_assist_envelope`
    (no installed package publishes it); its `request` is a GenerateContentRequest."""
    findings = []
    if not isinstance(body, dict):
        return [Finding("$", "type", "CodeAssistEnvelope", "expected object")]
    members = envelope["members"]
    for key, v in body.items():
        if key not in members:
            findings.append(Finding(f"$.{key}", "extra", "CodeAssistEnvelope", f"the envelope has no member {key!r}"))
        elif key != "request" and json_type(v) != members[key]["type"]:
            findings.append(Finding(f"$.{key}", "type", "CodeAssistEnvelope", f"expected {members[key]['type']}, got {json_type(v)}"))
    for key, m in members.items():
        if m.get("required") and key not in body:
            findings.append(Finding(f"$.{key}", "missing", "CodeAssistEnvelope", f"the envelope requires {key!r}"))
    if "request" in body:
        findings += walker.check(body["request"], REQUEST_SCHEMA, "$.request", "GenerateContentRequest")
    ctx.mark(findings)
    return findings


# ---- Bedrock Converse: botocore's service model -----------------------------------------------
#
# botocore ships the Bedrock Runtime service model (Smithy shapes as botocore JSON). The body of
# ConverseStream is the ConverseStreamRequest structure less its members bound to the URI or
# headers (`location`: modelId). Shapes: structure (members, required; `union: true` means exactly
# one member set; `document: true` is any JSON), list (member, min/max items), map (key, value),
# string (enum, pattern — not anchored, as Smithy says — and min/max length), integer/long (whole
# numbers, min/max), float/double (numbers), boolean, blob (base64 text in JSON, min/max bytes),
# timestamp (number or ISO text).


class SmithyWalker:
    def __init__(self, model):
        self.shapes = model["shapes"]

    def check(self, value, name, path):
        shape = self.shapes[name]
        kind = shape["type"]
        if kind == "structure":
            if shape.get("document"):
                return []
            if not isinstance(value, dict):
                return [Finding(path, "type", name, f"expected object, got {json_type(value)}")]
            members = {k: m for k, m in shape["members"].items() if "location" not in m}
            out = []
            for key, v in value.items():
                if key not in members:
                    out.append(Finding(f"{path}.{key}", "extra", name, f"{name} has no member {key!r}"))
                elif v is None:
                    out.append(Finding(f"{path}.{key}", "type", name, "null is not a value in Smithy JSON"))
                else:
                    out += self.check(v, members[key]["shape"], f"{path}.{key}")
            for key in shape.get("required", []):
                if key in members and key not in value:
                    out.append(Finding(f"{path}.{key}", "missing", name, f"{name} requires {key!r}"))
            if shape.get("union") and len(value) != 1:
                out.append(Finding(path, "union", name, f"{name} is a union: exactly one member, got {sorted(value)}"))
            return out
        if kind == "list":
            if not isinstance(value, list):
                return [Finding(path, "type", name, f"expected array, got {json_type(value)}")]
            out = self.bounds(len(value), shape, path, name, "items")
            for i, v in enumerate(value):
                out += self.check(v, shape["member"]["shape"], f"{path}[{i}]")
            return out
        if kind == "map":
            if not isinstance(value, dict):
                return [Finding(path, "type", name, f"expected object, got {json_type(value)}")]
            out = []
            for k, v in value.items():
                out += self.check(k, shape["key"]["shape"], f"{path}.{k}<key>")
                out += self.check(v, shape["value"]["shape"], f"{path}.{k}")
            return out
        if kind == "string":
            if not isinstance(value, str):
                return [Finding(path, "type", name, f"expected string, got {json_type(value)}")]
            if "enum" in shape and value not in shape["enum"]:
                return [Finding(path, "enum", name, f"{value!r} is not one of {shape['enum']}", value)]
            out = self.bounds(len(value), shape, path, name, "characters")
            if "pattern" in shape and re.search(shape["pattern"], value) is None:
                out.append(Finding(path, "constraint", name, f"{value[:60]!r} does not match {shape['pattern']!r}"))
            return out
        if kind in ("integer", "long"):
            if not isinstance(value, int) or isinstance(value, bool):
                return [Finding(path, "type", name, f"expected integer, got {json_type(value)}")]
            return self.bounds(value, shape, path, name, "")
        if kind in ("float", "double"):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                return [Finding(path, "type", name, f"expected number, got {json_type(value)}")]
            return self.bounds(value, shape, path, name, "")
        if kind == "boolean":
            return [] if isinstance(value, bool) else [Finding(path, "type", name, f"expected boolean, got {json_type(value)}")]
        if kind == "blob":
            if not isinstance(value, str):
                return [Finding(path, "type", name, f"expected base64 text, got {json_type(value)}")]
            if not is_base64(value):
                return [Finding(path, "constraint", name, f"{value[:40]!r} is not base64 (blob)", value)]
            return []
        if kind == "timestamp":
            return [] if isinstance(value, (int, float, str)) else [Finding(path, "type", name, "expected a timestamp")]
        raise SystemExit(f"api-schema: no rule for the Smithy shape type {kind!r} ({name})")

    @staticmethod
    def bounds(n, shape, path, name, unit):
        out = []
        if "min" in shape and n < shape["min"]:
            out.append(Finding(path, "constraint", name, f"{n} {unit} is under the minimum {shape['min']}".replace("  ", " ")))
        if "max" in shape and n > shape["max"]:
            out.append(Finding(path, "constraint", name, f"{n} {unit} is over the maximum {shape['max']}".replace("  ", " ")))
        return out


def load_smithy():
    import botocore
    found = sorted(glob.glob(os.path.join(os.path.dirname(botocore.__file__), "data", "bedrock-runtime", "*", "service-2.json*")))
    if not found:
        raise SystemExit("api-schema: botocore ships no bedrock-runtime service model")
    path = found[-1]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return SmithyWalker(json.load(f))


def check_bedrock(ctx, body, walker):
    findings = walker.check(body, "ConverseStreamRequest", "$")
    ctx.mark(findings)
    return findings


# ---- the run ----------------------------------------------------------------------------------

FAMILIES = ("anthropic_messages", "openai_chat", "openai_responses", "openai_chatgpt_responses",
            "google_generate_content", "google_code_assist", "aws_bedrock_converse")


def request_files(args):
    for arg in args:
        if os.path.isdir(arg):
            for root, _, files in sorted(os.walk(arg)):
                for name in sorted(files):
                    if name.startswith("request.") and name.endswith(".json"):
                        yield os.path.join(root, name)
        else:
            yield arg


def main(argv):
    exceptions_path = DEFAULT_EXCEPTIONS
    if len(argv) >= 2 and argv[0] == "--exceptions":
        exceptions_path, argv = argv[1], argv[2:]
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    exceptions = Exceptions(exceptions_path)
    discovery = smithy = None
    requests = violations = 0
    per_family = collections.Counter()
    for path in request_files(argv):
        name = os.path.basename(path)[: -len(".json")]
        parts = name.split(".")
        family = parts[1] if len(parts) > 2 else ""
        if family not in FAMILIES:
            print(f"VIOLATION {name} $ type [file]: no family {family!r} in the name request.<family>.<case>.json")
            violations += 1
            continue
        with open(path, encoding="utf-8") as f:
            body = json.load(f)
        ctx = Context(family, name, exceptions)
        if family in ("google_generate_content", "google_code_assist"):
            discovery = discovery or load_discovery()
            if family == "google_code_assist":
                findings = check_code_assist(ctx, body, discovery, exceptions.code_assist_envelope)
            else:
                findings = check_gemini(ctx, body, discovery)
        elif family == "aws_bedrock_converse":
            smithy = smithy or load_smithy()
            findings = check_bedrock(ctx, body, smithy)
        else:
            findings = check_typed(ctx, body)
        requests += 1
        per_family[family] += 1
        for f in findings:
            if f.allowed_by:
                exceptions.used[f.allowed_by] += 1
            else:
                violations += 1
                print(f"VIOLATION {name} {f.path} {f.kind} [{f.where}]: {f.why}")
    for family in FAMILIES:
        if per_family[family]:
            print(f"FAMILY {family} requests={per_family[family]}")
    for name, count in sorted(exceptions.used.items()):
        print(f"ALLOWED {name} {count}")
    for e in exceptions.entries:
        if e["name"] not in exceptions.used:
            print(f"UNUSED-EXCEPTION {e['name']}")
    print(f"API-SCHEMA requests={requests} violations={violations}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
