"""What crosses the wire: plain values (None, bool, int, float, str, bytes,
lists and dicts of them) to and from pydantic models, dataclasses and any
other type pydantic validates."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar, overload

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ._errors import BadResult, EncodeError

__all__ = ["plain", "adapter", "validate_result", "brief"]

T = TypeVar("T")

_PLAIN = (str, int, float, bool, bytes, type(None))


def plain(value: Any) -> Any:
    """``value`` as plain data: models and dataclasses are dumped (as JSON
    would see them), containers are walked, bytes stay bytes."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, BaseModel):
        # Python mode, then walked: bytes stay bytes (JSON mode would make
        # them text, and fail on bytes that are not UTF-8).
        return plain(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(adapter(type(value)).dump_python(value))
    try:
        return to_jsonable_python(value)
    except PydanticSerializationError:
        raise EncodeError(
            f"a {type(value).__name__} cannot be sent: send None, bool, int, float, str, bytes, "
            "lists and dicts of them, or a pydantic model or dataclass"
        ) from None


@functools.lru_cache(maxsize=1024)
def adapter(tp: Any) -> TypeAdapter[Any]:
    """One adapter per type (they are costly to build)."""
    return TypeAdapter(tp)


@overload
def validate_result(raw: Any, tp: type[T]) -> T: ...
@overload
def validate_result(raw: Any, tp: None) -> Any: ...
def validate_result(raw: Any, tp: Any) -> Any:
    """A peer's result as ``tp`` (as it came when ``tp`` is ``None``)."""
    if tp is None:
        return raw
    try:
        return adapter(tp).validate_python(raw)
    except ValidationError as e:
        raise BadResult(brief(e)) from None


def brief(e: ValidationError, limit: int = 512) -> str:
    """A short account of what failed validation, without the input."""
    parts = []
    for err in e.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in err.get("loc", ())) or "value"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    text = "; ".join(parts) or "invalid"
    return text if len(text) <= limit else text[: limit - 3] + "..."
