"""Command-line options generated from the stage settings models, so names, choices, ranges and defaults
are written once (in the model) and never copied into the CLI.

Every field becomes an option (`--field-name`; nested settings as `--parent-field`,
or the name a field asks for with `json_schema_extra={"cli": "--name"}`), with a
click type from its annotation: Literal and Enum become choices, bounded numbers
ranges, bools `--x/--no-x` pairs. An option the user did not give stays None,
so the layers below it (params.yaml, the model's defaults) decide; the help
text shows the model's default and any environment variable behind it.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import annotated_types
import click
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from spinn.ground.settings import Layer, Settings, settings_type

F = TypeVar("F", bound=Callable[..., Any])
SEPARATOR = "__"
"""Joins a nested field's path into the command's keyword name: columns__premise."""
SKIPPED = "skipped"
DEPRECATION_RELEASE = "0.3"
"""Old option spellings keep working, with a warning, until this release."""


def field_options(model: type[Settings], *, exclude: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Decorate a click command with one option per field of `model` (fields in `exclude` and the model's
    `not_on_cli` left out)."""

    def decorate(command: F) -> F:
        for path, info, default, note in reversed(list(_fields(model, (), None, exclude))):
            option = _option(path, info, default, note)
            if option is not None:
                command = option(command)
        return command

    return decorate


def option_names(model: type[Settings], *, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """Dotted field -> the option naming it (fields that have none are absent)."""
    return {
        ".".join(path): _option_name(path, info).split("/")[0]
        for path, info, _, _ in _fields(model, (), None, exclude)
        if _click_type(info.annotation) is not SKIPPED
    }


def given(model: type[Settings], options: dict[str, Any]) -> dict[str, Any]:
    """Pop the generated options out of a command's keyword arguments: the nested values the user gave."""
    values: dict[str, Any] = {}
    for path, *_ in list(_fields(model, (), None, ())):
        value = options.pop(SEPARATOR.join(path), None)
        if value is not None:
            target = values
            for parent in path[:-1]:
                target = target.setdefault(parent, {})
            target[path[-1]] = value
    return values


def resolve(model: type[Settings], config: Path | None, *layers: dict[str, Any] | Layer, exclude: tuple[str, ...] = ()):
    """The command's settings: params section (when --config is given), then the layers (a plain dict:
    the options the user gave); a problem is named where its value was written, an option's by the option."""

    def option(key: str) -> str:
        return option_names(model, exclude=exclude).get(key, key)

    return model.from_params(config, *(layer if isinstance(layer, Layer) else Layer(layer, option) for layer in layers))


def renamed_option(old: str, new: str, dest: str, **attributes: Any) -> Callable[[F], F]:
    """A hidden old spelling of an option: still accepted, with a warning that names the new one."""

    def warn(context: click.Context, parameter: click.Parameter, value: Any) -> Any:
        if value is not None:
            click.echo(f"warning: {old} is deprecated and goes in {DEPRECATION_RELEASE}; use {new}", err=True)
        return value

    return click.option(old, dest, hidden=True, callback=warn, **attributes)


# ----------------------------------------------------------------------------- fields -> options


def _fields(
    model: type[Settings],
    prefix: tuple[str, ...],
    defaults: Any,
    exclude: tuple[str, ...],
    inherited: str | None = None,
) -> Iterator[tuple[tuple[str, ...], FieldInfo, Any, str | None]]:
    """(path, field, default, where its default comes from) of every leaf field, nested settings flattened.

    A parent's default instance supplies its children's defaults (train's model defaults are the pi
    preset's, not SPINNConfig's), and a parent whose defaults come from elsewhere (`default_from`) says so
    for its children, unless a child says otherwise."""
    if not prefix:
        exclude = (*exclude, *model.not_on_cli)
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        if ".".join(path) in exclude:
            continue
        default = getattr(defaults, name) if defaults is not None else _default(info)
        extra = _extra(info)
        note = extra["default_from"] if "default_from" in extra else inherited
        nested = settings_type(info.annotation)
        if nested is not None:
            yield from _fields(nested, path, default if isinstance(default, Settings) else None, exclude, note)
        else:
            yield path, info, default, note


def _extra(info: FieldInfo) -> dict[str, Any]:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def _default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.default_factory()
    return None if info.default is PydanticUndefined else info.default


def _option(path: tuple[str, ...], info: FieldInfo, default: Any, note: str | None) -> Callable[[F], F] | None:
    click_type = _click_type(info.annotation)
    if click_type is SKIPPED:
        return None
    name, dest = _option_name(path, info), SEPARATOR.join(path)
    required = info.is_required() and len(path) == 1
    help_text = _help(info, default, note, required)
    if click_type is bool:
        flags = name if "/" in name else f"{name}/--no-{name.removeprefix('--')}"
        return click.option(flags, dest, default=None, help=help_text)
    return click.option(name, dest, type=bounded(click_type, info), default=None, required=required, help=help_text)


def _option_name(path: tuple[str, ...], info: FieldInfo) -> str:
    return _extra(info).get("cli") or "--" + "-".join(path).replace("_", "-")


def _help(info: FieldInfo, default: Any, note: str | None, required: bool) -> str:
    """The field's docstring, then where its default comes from (unless the docstring already says); an
    option click itself requires gets click's own "[required]", not a second one."""
    text = " ".join((info.description or "").split())
    variable = getattr(info.default_factory, "variable", None)
    if variable:
        return f"{text} [env var: {variable}]"
    if note:
        return f"{text} [default: {note}]"
    if info.is_required():
        return text if required else f"{text} [required]"
    if default is None and "(default:" in text:
        return text
    shown = default.value if isinstance(default, enum.Enum) else default
    return f"{text} [default: {'none' if shown is None else shown}]"


def _click_type(annotation: Any) -> Any:
    """The click type for a field's annotation, or SKIPPED for what has no command-line form (dicts).
    A union of several kinds (a number or "auto") is taken as text and left to the model to read."""
    annotation = _without_none(annotation)
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return str
    if origin is Literal:
        return click.Choice([str(value) for value in get_args(annotation)])
    if origin is not None and get_args(annotation) and origin.__name__ == "Annotated":
        return _click_type(get_args(annotation)[0])
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return click.Choice([member.value for member in annotation])
        if annotation is bool:
            return bool
        if annotation is Path:
            return click.Path(path_type=Path)
        if annotation in (int, float, str):
            return annotation
    return SKIPPED


def bounded(click_type: Any, info: FieldInfo) -> Any:
    """An int or float option's range from the field's ge/gt/le/lt bounds."""
    if click_type not in (int, float):
        return click_type
    low = high = None
    low_open = high_open = False
    for constraint in info.metadata:
        if isinstance(constraint, annotated_types.Ge):
            low = constraint.ge
        elif isinstance(constraint, annotated_types.Gt):
            low, low_open = constraint.gt, True
        elif isinstance(constraint, annotated_types.Le):
            high = constraint.le
        elif isinstance(constraint, annotated_types.Lt):
            high, high_open = constraint.lt, True
    if low is None and high is None:
        return click_type
    kind = click.IntRange if click_type is int else click.FloatRange
    return kind(low, high, min_open=low_open, max_open=high_open)


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        arguments = [argument for argument in get_args(annotation) if argument is not type(None)]
        if len(arguments) == 1:
            return arguments[0]
    return annotation
