"""Value types for the modules a restarted consumer imports before its first record.

``dataclasses`` writes each class's methods as source text and compiles it when the class is
created: six functions for a frozen class, about 0.8 ms per class.  The mode's twenty-odd value
types cost about 15 ms of CPU that way, half of the mode's import, and that import runs while the
group join waits (:mod:`fastrecover.startup`): on a small machine it outlasted the join and came
before the first fresh record.  :func:`value` (frozen) and :func:`record` (mutable) give the same
behaviour from functions shared by every class, made without compiling anything:

* ``__init__`` takes the fields in order, positionally or by name, fills in defaults (a
  :func:`field` factory is called per instance) and then calls ``__post_init__`` if the class has one;
* ``__eq__`` compares the fields of two instances of the same class; ``__repr__`` lists them;
* a :func:`value` is hashable on its fields and refuses assignment
  (:class:`~fastrecover.errors.FrozenInstanceError`); a :func:`record` is mutable and unhashable,
  like a dataclass with ``eq=True``;
* instances pickle and copy through their fields; :func:`replace` makes a changed copy.

Type checkers see dataclasses (``typing.dataclass_transform``).  Modules that are not imported on
that path (metrics snapshots, the rollback tool, Spark) keep ``dataclasses``.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar, cast

from fastrecover.errors import FrozenInstanceError

if TYPE_CHECKING:  # typing has it from Python 3.11; typing_extensions (SQLAlchemy's dependency) costs an import
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[T], T]:
        return lambda decorator: decorator


T = TypeVar("T")
#: mutable defaults a class must not share between its instances (as dataclasses refuses them)
_UNSHAREABLE = (list, dict, set)


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], T]) -> T:
    """A default made anew for each instance (a list, a dict), as ``dataclasses.field`` makes it."""
    return cast(T, _Factory(default_factory))


def _fields(cls: type) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The class's field names in order (its bases' first) and their defaults."""
    names: list[str] = []
    defaults: dict[str, Any] = {}
    for base in reversed(cls.__mro__[1:]):
        inherited = base.__dict__.get("__value_fields__")
        if inherited is not None:
            names += [n for n in inherited if n not in names]
            defaults.update(base.__dict__["__value_defaults__"])
    # not inspect.get_annotations: importing inspect costs more than every class here together
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
        if str(annotation).replace("typing.", "").startswith("ClassVar"):
            continue
        if name not in names:
            names.append(name)
        if name in cls.__dict__:
            default = cls.__dict__[name]
            if isinstance(default, _UNSHAREABLE):
                raise TypeError(f"{cls.__qualname__}.{name}: a mutable default would be shared; use field()")
            defaults[name] = default
            if isinstance(default, _Factory):
                delattr(cls, name)
        elif defaults and name not in defaults:
            raise TypeError(f"{cls.__qualname__}.{name}: a field without a default follows one with a default")
    return tuple(names), defaults


def _build(cls: type[T], frozen: bool) -> type[T]:
    names, defaults = _fields(cls)
    count = len(names)
    post_init = getattr(cls, "__post_init__", None)
    astuple = (
        attrgetter(*names) if count > 1 else (lambda obj: (getattr(obj, names[0]),)) if count else (lambda obj: ())
    )
    title = cls.__qualname__
    known = frozenset(names)
    #: the fields the first N positional arguments give, for each N (a keyword must not repeat one)
    positional = [frozenset(names[:given]) for given in range(count + 1)]
    factories = any(isinstance(given, _Factory) for given in defaults.values())

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # into the instance's dict in a few calls: a frozen value's __setattr__ refuses, and one call
        # per field cost microseconds on the paths that make values per partition or per batch
        given = len(args)
        if (
            factories
            or given > count
            or (kwargs and not (kwargs.keys() <= known and kwargs.keys().isdisjoint(positional[given])))
        ):
            self.__dict__.update(bind(args, kwargs))  # raises the error, or calls the default factories
        else:
            fields = self.__dict__
            fields.update(defaults)  # those the arguments do not name keep these
            fields.update(zip(names, args, strict=False))
            if kwargs:
                fields.update(kwargs)
            if len(fields) < count:
                bind(args, kwargs)  # raises: a field without default is missing
        if post_init is not None:
            post_init(self)

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > count:
            raise TypeError(f"{title}() takes {count} field(s), {len(args)} given")
        bound = dict(zip(names, args, strict=False))
        for name in names[len(args) :]:
            if name in kwargs:
                bound[name] = kwargs.pop(name)
            elif name in defaults:
                given = defaults[name]
                bound[name] = given.make() if isinstance(given, _Factory) else given
            else:
                raise TypeError(f"{title}() is missing the field {name!r}")
        if kwargs:
            raise TypeError(f"{title}() got unexpected or repeated field(s): {', '.join(sorted(kwargs))}")
        return bound

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is self.__class__:
            return bool(astuple(self) == astuple(other))
        return NotImplemented

    def __repr__(self: Any) -> str:
        return f"{title}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    def __reduce__(self: Any) -> tuple[type, tuple[Any, ...]]:
        return self.__class__, tuple(astuple(self))

    methods: dict[str, Any] = {
        "__init__": __init__,
        "__eq__": __eq__,
        "__repr__": __repr__,
        "__reduce__": __reduce__,
        "__match_args__": names,
        "__value_fields__": names,
        "__value_defaults__": defaults,
    }
    if frozen:

        def __hash__(self: Any) -> int:
            return hash(astuple(self))

        def __setattr__(self: Any, name: str, given: Any) -> None:
            raise FrozenInstanceError(f"cannot assign to field {name!r} of {title}: it is a frozen value")

        def __delattr__(self: Any, name: str) -> None:
            raise FrozenInstanceError(f"cannot delete field {name!r} of {title}: it is a frozen value")

        methods.update(__hash__=__hash__, __setattr__=__setattr__, __delattr__=__delattr__)
    else:
        methods["__hash__"] = None
    for name, method in methods.items():
        if callable(method):
            method.__qualname__ = f"{title}.{name}"
        own = cls.__dict__.get(name)
        if own is not None and (name != "__hash__" or callable(own)):
            continue  # the class's own method wins, as with dataclasses (a class with __eq__ has __hash__ None)
        setattr(cls, name, method)
    return cls


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def value(cls: type[T]) -> type[T]:
    """A frozen value type: hashable, compared and shown by its fields, never changed in place."""
    return _build(cls, frozen=True)


@dataclass_transform(field_specifiers=(field,))
def record(cls: type[T]) -> type[T]:
    """A mutable record: compared and shown by its fields, changed in place by its owner."""
    return _build(cls, frozen=False)


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of the value ``obj`` with ``changes`` to some of its fields."""
    fields = {name: getattr(obj, name) for name in obj.__class__.__value_fields__}  # type: ignore[attr-defined]
    fields.update(changes)
    return obj.__class__(**fields)
