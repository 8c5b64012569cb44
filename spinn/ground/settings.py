"""Stage settings: one typed model per stage, read the same way by params.yaml, the CLI, Prefect and DVC.

Each stage declares its knobs once, as a `Settings` model next to the stage
function, with types, bounds, defaults and a docstring per field. Everything
else is derived from that model: params.yaml's section is validated against
it, the `spinn` command's options (names, choices, ranges, defaults, help) are
generated from it (spinn/options.py), and the Prefect flows take its
`overrides()` model, every field optional, as a typed form. Settings are
resolved in layers: the model's defaults, then the params file's section, then
what the user gave for this run.
"""

from __future__ import annotations

import difflib
import os
import types
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, Self, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
)

from spinn.ground import cores
from spinn.ground.errors import SpinnError
from spinn.ground.paths import refuse_special_file

DEFAULT_PARAMS = Path("params.yaml")
AUTO = cores.AUTO
Device = Literal["auto", "cpu", "cuda"]
"""Where torch runs; auto: the GPU when there is one."""
PARAMS_SECTIONS = frozenset({"download", "prepare", "vocab", "embeddings", "train", "evaluate"})
"""The sections params.yaml may hold: one per stage of `dvc repro`. Any other is a misspelling and is refused,
since a section nobody reads would silently leave its stage on its defaults. Every `Settings.section` must be
one of them (checked when the stage's model is defined)."""


SET_OPTION = "--set"
"""The option of KEY=VALUE overrides, on every command that has one (`spinn train`, `spinn-pipeline`)."""


class SettingsError(SpinnError, ValueError):
    """Settings that do not validate; `problems` keeps (place, message) per problem, the place being where
    the user wrote the value in their own words (see `Layer`)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{place}: {message}" for place, message in problems))


class Conflict(ValueError):
    """A problem of several fields together, raised by a model validator with the fields in the order to blame
    them: the error names the first one the user set, in the words of the place that set it (`--profile`),
    since a problem of the settings as a whole has no field of its own to be named by."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields


class Problem(NamedTuple):
    """One validation problem in plain words, and the fields it is about: one field's path, or for a
    `Conflict` each of its fields' paths, in the order to blame them."""

    locs: tuple[tuple[str, ...], ...]
    message: str


class Layer(NamedTuple):
    """Settings from one place the user wrote them, and how that place names a dotted key.

    A bad value is reported where it was written, in the words of that place: `params.yaml: train:
    max_steps`, `--set max_steps`, `--max-steps`. A plain dict given to `Settings.build` is named by its
    `where` (a checkpoint's stored config, a sidecar file)."""

    values: dict[str, Any]
    place: Callable[[str], str]


class Settings(BaseModel):
    """Base of every stage's settings: frozen, strict about unknown keys, documented field by field."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, protected_namespaces=(), use_attribute_docstrings=True, allow_inf_nan=False
    )
    """allow_inf_nan=False: no setting is ever infinite or NaN (`--learning-rate inf`, `.inf` in params.yaml
    would train a model of NaN weights), so every float is validated finite here, once, for every stage."""

    section: ClassVar[str | None] = None
    """The params.yaml section this stage reads (None: the stage is not part of `dvc repro`)."""
    not_on_cli: ClassVar[dict[str, str]] = {}
    """Fields the stage's command does not offer as options (a nested one dotted: `columns.label`), each with
    the reason (tests hold us to it)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        section = cls.__dict__.get("section")
        if section is not None and section not in PARAMS_SECTIONS:
            raise TypeError(f"{cls.__name__}.section {section!r} is not one of PARAMS_SECTIONS")

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's `true` is not the number 1: `max_epochs: true` is refused, not read as one epoch."""
        if isinstance(value, bool) and _is_number(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value

    @classmethod
    def build(cls, *layers: dict[str, Any] | Layer, where: str | None = None) -> Self:
        """Validate the merged layers (later ones win, nested sections merge key by key); each problem is
        named by the layer whose value failed (the last one that holds the key), a key nobody gave (a
        required one) by the last layer, where the user would give it, and only a problem of the settings as
        a whole that names no field (no `Conflict`) by `where`."""
        where = where or cls.section or cls.__name__
        named = [layer if isinstance(layer, Layer) else Layer(layer, lambda key: f"{where}: {key}") for layer in layers]
        merged: dict[str, Any] = {}
        for layer in named:
            merged = deep_merge(merged, layer.values)
        try:
            return cls.model_validate(merged)
        except ValidationError as error:
            last = named[-1] if named else Layer({}, lambda key: f"{where}: {key}")
            raise SettingsError(_placed(describe(error, cls), named, merged, last, where)) from None

    @classmethod
    def from_params(cls, path: Path | None, *overrides: dict[str, Any] | Layer) -> Self:
        """The stage's params.yaml section (none when path is None), then the overrides."""
        section = [params_layer(path, cls.section)] if path is not None and cls.section else []
        return cls.build(*section, *overrides)

    def replace(self, **changes: Any) -> Self:
        """A validated copy with some fields changed (pydantic's model_copy does not validate)."""
        return type(self).build(self.model_dump(), changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data, as stored in checkpoints and logged to MLflow."""
        return self.model_dump(mode="json")

    @classmethod
    def overrides(cls) -> type[BaseModel]:
        """The same fields, every one optional and None by default: what a run may override (Prefect forms)."""
        return _overrides_model(cls)


def env_default(variable: str) -> Callable[[], str | None]:
    """A default read from the environment when the settings are made, so the CLI, DVC stages and
    Prefect deployments all honour the same variables."""

    def read() -> str | None:
        return os.environ.get(variable) or None

    read.variable = variable  # type: ignore[attr-defined]  (the CLI's help names it)
    return read


def count_or_auto(unit: str, most: Callable[[int], int] | None = None) -> Any:
    """The type of a setting that is a count (at least 1) of `unit` or "auto" (decided where the run
    knows its machine), with one clear message for anything else; `most` checks a count's upper bound."""

    def check(value: Any) -> int | str:
        if value == AUTO:
            return AUTO
        if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
            raise ValueError(f"must be a number of {unit} or {AUTO!r} (got {value!r})")
        if int(value) < 1:
            raise ValueError(f"must be at least 1 (got {value!r})")
        return most(int(value)) if most is not None else int(value)

    return Annotated[
        int | Literal["auto"],
        PlainValidator(check),
        WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1}, {"const": AUTO}]}),
    ]


def within_the_machine(threads: int) -> int:
    """A thread count this machine can run: at most MOST_THREADS_PER_CORE per usable core (spinn/ground/cores.py)."""
    most = cores.most_threads()
    if threads > most:
        raise ValueError(
            f"must be at most {most}: {cores.MOST_THREADS_PER_CORE} per core this process may use (got {threads})"
        )
    return threads


ThreadCount = count_or_auto("threads", most=within_the_machine)
"""torch threads: a number, or auto, the rule of spinn/ground/cores.py (the cores other work leaves free)."""
ThreadNumber = Annotated[int, Field(ge=1), AfterValidator(within_the_machine)]
"""torch threads as a number (at least 1, at most what the machine can run)."""


def _is_number(annotation: Any) -> bool:
    """Whether a field holds a plain int or float (`int`, `float | None`, `Annotated[int, ...]`)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_number(argument) for argument in get_args(annotation) if argument is not type(None))
    if get_origin(annotation) is Annotated:
        return _is_number(get_args(annotation)[0])
    return annotation in (int, float)


def deep_merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


PLAIN_WORDS = {
    "extra_forbidden": "unknown setting",
    "missing": "is required",
    "greater_than_equal": "must be at least {ge}",
    "less_than_equal": "must be at most {le}",
    "greater_than": "must be more than {gt}",
    "less_than": "must be less than {lt}",
    "model_type": "must be a section of settings, not a single value",
    "model_attributes_type": "must be a section of settings, not a single value",
    "dict_type": "must be a mapping of names to values",
}
"""pydantic's error types in the words every front end prints; the others keep pydantic's message, with
its validator prefix dropped and "Input should be" said as "must be"."""
PYDANTIC_PREFIX = "Value error, "
PYDANTIC_SHOULD, SHOULD = "Input should be ", "must be "
GOT = " (got "


def describe(error: ValidationError, model: type[BaseModel] | None = None) -> list[Problem]:
    """The problems in plain words: no pydantic prefix or URL, the rejected value when pydantic kept one,
    and for an unknown key of `model` the nearest known one."""
    problems = []
    for item in error.errors(include_url=False):
        loc = tuple(str(part) for part in item["loc"])
        cause = item.get("ctx", {}).get("error")
        fields = cause.fields if isinstance(cause, Conflict) else ()
        template = PLAIN_WORDS.get(item["type"])
        message = template.format(**item.get("ctx", {})) if template else item["msg"].removeprefix(PYDANTIC_PREFIX)
        if message.startswith(PYDANTIC_SHOULD):
            message = SHOULD + message.removeprefix(PYDANTIC_SHOULD)
        if item["type"] == "extra_forbidden":
            message += _did_you_mean(model, loc)
        elif "input" in item and not isinstance(item["input"], dict) and GOT not in message:
            message += f"{GOT}{item['input']!r})"
        problems.append(Problem(tuple((*loc, field) for field in fields) or (loc,), message))
    return problems


def _did_you_mean(model: type[BaseModel] | None, loc: tuple[str, ...]) -> str:
    """For a misspelt key of `model`, the known key closest to it (`; did you mean max_steps?`), if any is."""
    for part in loc[:-1]:
        info = model.model_fields.get(part) if model is not None else None
        model = settings_type(info.annotation) if info is not None else None
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1) if model is not None and loc else []
    return f"; did you mean {close[0]}?" if close else ""


def _placed(
    problems: list[Problem], layers: list[Layer], merged: dict[str, Any], last: Layer, where: str
) -> list[tuple[str, str]]:
    """(place, message) per problem, in the words of one rule for every command: the first of its fields
    that a layer holds, placed by the last layer that holds it (that layer's value won the merge and failed);
    a field no layer holds (a required one nobody gave, a conflict among defaults) by the `last` layer,
    where the user would give it; a problem of the settings as a whole that names no field at `where`."""
    placed = []
    for problem in problems:
        loc, source = _blamed(problem.locs, layers)
        if source is not None:
            place = source.place(_written_key(merged, loc))
        else:
            place = last.place(".".join(loc)) if loc else where
        placed.append((place, problem.message))
    return placed


def _blamed(locs: tuple[tuple[str, ...], ...], layers: list[Layer]) -> tuple[tuple[str, ...], Layer | None]:
    """The first of a problem's fields that some layer sets, with the last layer that sets it (its value won
    the merge); else the first field, set by none."""
    for loc in locs:
        source = next((layer for layer in reversed(layers) if loc and _holds(layer.values, loc)), None)
        if source is not None:
            return loc, source
    return locs[0], None


def _holds(values: dict[str, Any], loc: tuple[str, ...]) -> bool:
    """Whether a layer sets the value at `loc` (itself, or a whole section above it)."""
    node: Any = values
    for part in loc:
        if not isinstance(node, dict):
            return True
        if part not in node:
            return False
        node = node[part]
    return True


def _written_key(merged: dict[str, Any], loc: tuple[str, ...]) -> str:
    """The dotted key as the user wrote it: pydantic's loc cut where the value stops being a section (past
    that come pydantic's own tags, `batch_size.int`), whole for a key nobody wrote (a missing one)."""
    node: Any = merged
    for depth, part in enumerate(loc):
        if not isinstance(node, dict):
            return ".".join(loc[:depth])
        if part not in node:
            return ".".join(loc)
        node = node[part]
    return ".".join(loc)


# ----------------------------------------------------------------------------- params.yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: plain YAML keeps the last silently, so
    a setting written twice in params.yaml would be read as whichever came last, unnoticed."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (line {key_node.start_mark.line + 1})", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """`text` read as YAML by the one reader of settings (params.yaml, `--set` values): safe, and refusing a
    key given twice."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506  (a SafeLoader subclass)


def read_params(path: Path) -> dict[str, Any]:
    """The params file's sections, each one PARAMS_SECTIONS names; any problem is one line naming the file."""
    path = refuse_special_file(Path(path))
    try:
        data = load_yaml(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise SpinnError(f"{path}: no such params file") from None
    except IsADirectoryError:
        raise SpinnError(f"{path}: is a folder; name the params file, e.g. {path / DEFAULT_PARAMS}") from None
    except UnicodeDecodeError as error:
        raise SpinnError(f"{path}: not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    except OSError as error:
        raise SpinnError(f"{path}: cannot read it ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise SpinnError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpinnError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    unknown = sorted(str(key) for key in data if key not in PARAMS_SECTIONS)
    if unknown:
        known = ", ".join(sorted(PARAMS_SECTIONS))
        raise SpinnError(f"{path}: unknown section {', '.join(map(repr, unknown))}; the sections are {known}")
    return data


def params_layer(path: Path, section: str, *, under: str | None = None) -> Layer:
    """A params.yaml section as a settings layer (placed `under` a key of the stage's settings when the
    stage reads another stage's section); a bad value is named by the file, the section and its key there."""
    values = params_section(path, section)
    prefix = f"{under}." if under else ""
    return Layer({under: values} if under else values, lambda key: f"{path}: {section}: {key.removeprefix(prefix)}")


def params_section(path: Path, section: str) -> dict[str, Any]:
    """One stage's section of params.yaml (empty when absent), checked to be a mapping."""
    value = read_params(path).get(section)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpinnError(f"{path}: section {section!r} must be a mapping, got {type(value).__name__}")
    return dict(value)


# ----------------------------------------------------------------------------- KEY=VALUE overrides


def parse_override(override: str) -> tuple[str, Any]:
    """`model.d_hidden=100` -> ("model.d_hidden", 100): the value read as YAML."""
    key, separator, text = override.partition("=")
    if not separator or not key.strip():
        raise SpinnError(f"{SET_OPTION} {override!r}: expected KEY=VALUE, e.g. {SET_OPTION} model.d_hidden=100")
    try:
        return key.strip(), load_yaml(text)
    except yaml.YAMLError as error:
        problem = str(error).splitlines()[0]
        raise SpinnError(f"{SET_OPTION} {key.strip()}: the value {text!r} is not valid YAML ({problem})") from None


def flatten(nested: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """{"model": {"d_hidden": 100}} -> ("model.d_hidden", 100): nest's inverse, for MLflow params."""
    for key, value in nested.items():
        if isinstance(value, dict):
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def nest(flat: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """[("model.d_hidden", 100)] -> {"model": {"d_hidden": 100}}."""
    nested: dict[str, Any] = {}
    for key, value in flat:
        *parents, leaf = key.split(".")
        target = nested
        for depth, parent in enumerate(parents):
            target = target.setdefault(parent, {})
            if not isinstance(target, dict):
                section = ".".join(parents[: depth + 1])
                raise SpinnError(f"{SET_OPTION} {key}: {section} is given a value, so it is not a section here")
        target[leaf] = value
    return nested


def overrides_from(pairs: Iterable[str]) -> dict[str, Any]:
    """`--set` arguments as nested settings."""
    return nest(parse_override(pair) for pair in pairs)


def set_layer(pairs: Iterable[str]) -> Layer:
    """`--set` arguments as a settings layer: a bad value is named `--set KEY`, whatever the command."""
    return Layer(overrides_from(pairs), lambda key: f"{SET_OPTION} {key}")


# ----------------------------------------------------------------------------- optional twins


def settings_type(annotation: Any) -> type[Settings] | None:
    """The Settings model inside an annotation (`X`, `X | None`), or None."""
    candidates = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, Settings):
            return candidate
    return None


@cache
def _overrides_model(model: type[Settings]) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        nested = settings_type(info.annotation)
        annotation = _overrides_model(nested) if nested is not None else info.annotation
        fields[name] = (annotation | None, None)
    twin = create_model(
        f"{model.__name__}Overrides",
        __config__=ConfigDict(extra="forbid", protected_namespaces=()),
        __doc__=f"Overrides of {model.__name__}: a field left empty keeps the params file's value or the default.",
        **fields,
    )
    for name, info in model.model_fields.items():  # keep each field's help text for the Prefect form
        twin.model_fields[name].description = info.description
    twin.model_rebuild(force=True)
    return twin
