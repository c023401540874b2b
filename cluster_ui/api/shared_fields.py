"""Serializers that build their fields once per class instead of once per request.

DRF deep-copies and re-initialises every declared field for every serializer instance, and binds
each to it; for a job (27 input fields, 45 output fields) that was a third of a submission's
Python time. These mixins keep DRF's own validation and representation code paths and only
share the built fields: ``tests/jobs/test_submit_checks.py`` and
``tests/jobs/test_submit_representation.py`` check that the results are DRF's to the byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property

from rest_framework import serializers
from rest_framework.fields import SkipField, empty
from rest_framework.relations import PKOnlyObject
from rest_framework.utils import html
from rest_framework.utils.serializer_helpers import BindingDict

_BUILT_FIELDS: dict[type, dict] = {}


def _fields_built_once(cls) -> dict:
    """``cls``'s fields, built and bound once to a blank instance of it."""
    built = _BUILT_FIELDS.get(cls)
    if built is None:
        blank = cls()
        bound = BindingDict(blank)
        for name, field in blank.get_fields().items():
            bound[name] = field
        built = _BUILT_FIELDS[cls] = bound.fields
    return built


class FieldsBuiltOnce:
    """Fields built once per class, each instance given shallow copies bound to it. DRF builds
    every field of every instance afresh (a deep copy, each field's ``__init__`` run again): 0.4 ms a
    serializer, two of which answer every submission. For serializers whose fields keep nothing per
    request: nested children (a list's item field, a nested serializer's fields) are shared, bound
    to a blank instance that carries no request; only the top level is bound to this one."""

    @cached_property
    def fields(self):
        fields = BindingDict(self)
        for name, field in _fields_built_once(type(self)).items():
            clone = object.__new__(type(field))
            clone.__dict__.update(field.__dict__)
            clone.parent = self
            fields.fields[name] = clone
        return fields


# How RepresentedOnce reads each field: a column of the model, a method of the serializer, or as
# DRF reads any field.
_COLUMN, _METHOD, _FIELD = range(3)
_REPRESENTATION_PLANS: dict[type, tuple] = {}


class RepresentedOnce(FieldsBuiltOnce):
    """DRF's ``Serializer.to_representation`` over the fields built once per class, without binding
    copies of them to this instance (45 of them are a third of answering with a job): a field whose
    source is one of the model's own columns is read straight off the row (its value is never a
    callable, which is all DRF's ``get_attribute`` adds), a ``SerializerMethodField`` calls this
    serializer's method, and every other field (relations, nested serializers, defaults) reads as
    DRF reads it. Each value goes through the field's own ``to_representation``, ``None`` as
    ``None``, so the answer is DRF's to the byte (``tests/jobs/test_submit_representation.py``).

    Only for read-only serializers whose fields read no context: the shared fields are bound to a
    blank instance that carries no request."""

    def to_representation(self, instance):
        plan = _REPRESENTATION_PLANS.get(type(self))
        if plan is None:
            plan = _REPRESENTATION_PLANS[type(self)] = self._representation_plan()
        ret = {}
        for name, how, field, source in plan:
            if how == _COLUMN:
                value = getattr(instance, source)
            elif how == _METHOD:
                ret[name] = getattr(self, source)(instance)
                continue
            else:
                try:
                    value = field.get_attribute(instance)
                except SkipField:
                    continue
                if isinstance(value, PKOnlyObject) and value.pk is None:
                    value = None
            ret[name] = None if value is None else field.to_representation(value)
        return ret

    @classmethod
    def _representation_plan(cls) -> tuple:
        columns = {field.name for field in cls.Meta.model._meta.concrete_fields if not field.is_relation}
        plan = []
        for name, field in _fields_built_once(cls).items():
            if field.write_only:
                continue
            if isinstance(field, serializers.SerializerMethodField):
                plan.append((name, _METHOD, field, field.method_name))
            elif len(field.source_attrs) == 1 and field.source_attrs[0] in columns and not isinstance(
                    field, (serializers.BaseSerializer, serializers.RelatedField, serializers.ManyRelatedField,
                            serializers.HiddenField, serializers.ReadOnlyField)):
                plan.append((name, _COLUMN, field, field.source_attrs[0]))
            else:
                plan.append((name, _FIELD, field, None))
        return tuple(plan)


# The serializer checking input now and the JSON object it checks, per thread (and task): not on
# the serializer itself, which may be a field shared by concurrent requests when it is nested.
_checking: ContextVar[tuple[object, Mapping | None] | None] = ContextVar("colony_checking", default=None)


class CheckedOnSharedFields(FieldsBuiltOnce):
    """Input checked by DRF's own ``to_internal_value`` on the fields built once per class, without
    copies bound to this instance (27 for a job spec); and, for a JSON object, with only the fields
    it gives, the required ones and those with a default. Each other field DRF would only skip (a
    field absent from a JSON object that is neither required nor has a default is skipped before
    any check of it or its ``validate_<name>`` runs); a form's absent fields may mean something
    (a checkbox left off), so a form is checked field by field as DRF does.

    Only for serializers never used with ``partial=True`` whose fields read no context: a field
    asks its root (the shared blank instance) for both. The checks that need the request are this
    serializer's own ``validate_*`` and ``validate``, which DRF calls on this instance."""

    def known_field_names(self):
        return _fields_built_once(type(self)).keys()

    def to_internal_value(self, data):
        given = data if isinstance(data, Mapping) and not html.is_html_input(data) else None
        token = _checking.set((self, given))
        try:
            return super().to_internal_value(data)
        finally:
            _checking.reset(token)

    @property
    def _writable_fields(self):
        checking = _checking.get()
        given = checking[1] if checking is not None and checking[0] is self else None
        for field, skipped_when_absent in _input_plan(type(self)).fields:
            if given is None or not skipped_when_absent or field.field_name in given:
                yield field

    def _read_only_defaults(self):
        # DRF's looks through every field bound to this instance for read-only ones with a default;
        # a class without any (a job spec) has none to add.
        return super()._read_only_defaults() if _input_plan(type(self)).read_only_defaults else {}


@dataclass(frozen=True)
class _InputPlan:
    fields: tuple  # (field, whether DRF skips it when a JSON object leaves it out), the writable ones
    read_only_defaults: bool  # whether some read-only field has a default


_INPUT_PLANS: dict[type, _InputPlan] = {}


def _input_plan(cls) -> _InputPlan:
    plan = _INPUT_PLANS.get(cls)
    if plan is None:
        fields = _fields_built_once(cls).values()
        plan = _INPUT_PLANS[cls] = _InputPlan(
            fields=tuple((field, not field.required and field.default is empty and field.source != "*"
                          and not isinstance(field, serializers.HiddenField))
                         for field in fields if not field.read_only),
            read_only_defaults=any(field.read_only and field.default is not empty for field in fields))
    return plan
