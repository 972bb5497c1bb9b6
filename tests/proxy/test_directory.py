"""Name resolution: namespaces, ambiguity, and service labels (the module docstring's rules)."""

from __future__ import annotations

import attrs
import pytest

from flexinfer_proxy.directory import InMemoryDirectory, ModelEntry, ModelKind


def model(
    name: str,
    namespace: str = "a",
    *,
    ready: bool = False,
    labels: tuple[str, ...] = (),
    active: tuple[str, ...] = (),
    priority: int = 100,
) -> ModelEntry:
    return ModelEntry(
        name=name,
        namespace=namespace,
        kind=ModelKind.MODEL,
        ready=ready,
        endpoint=f"http://{name}.{namespace}.svc:8000/v1",
        service_labels=labels,
        active_services=active,
        priority=priority,
    )


TWINS = [model("x", "a"), model("x", "b"), model("y", "b")]


def test_a_name_in_one_namespace_resolves_anywhere() -> None:
    resolution = InMemoryDirectory(TWINS).resolve("y")
    assert resolution.entry == TWINS[2]
    assert not resolution.by_service_label


def test_a_name_in_several_namespaces_is_ambiguous_without_an_order() -> None:
    resolution = InMemoryDirectory(TWINS).resolve("x")
    assert (resolution.entry, resolution.ambiguous) == (None, ("a", "b"))


def test_namespace_slash_name_picks_one_and_an_order_picks_the_first() -> None:
    everywhere = InMemoryDirectory(TWINS)
    assert everywhere.resolve("b/x").entry == TWINS[1]
    assert everywhere.resolve("c/x").entry is None
    ordered = InMemoryDirectory(TWINS, namespaces=["b", "a"])
    assert ordered.resolve("x").entry == TWINS[1]
    only_a = InMemoryDirectory(TWINS, namespaces=["a"])
    assert only_a.resolve("b/x").entry is None, "a namespace not watched is not reachable"


HOLDER = model("big", active=("chat",), labels=("chat",), priority=50)
PARKED = model("small", labels=("chat",), priority=200)


@pytest.mark.parametrize(
    ("members", "chosen"),
    [
        # The holder (its Service advertises the label), Ready: it holds the card.
        ([attrs.evolve(HOLDER, ready=True), attrs.evolve(PARKED, ready=True)], "big"),
        # Any Ready member beats a holder that is still loading.
        ([HOLDER, attrs.evolve(PARKED, ready=True)], "small"),
        # Nobody Ready: the holder (loading) rather than waking another.
        ([HOLDER, PARKED], "big"),
        # Nobody holds it: the best by priority is woken.
        ([attrs.evolve(HOLDER, active_services=()), PARKED], "small"),
    ],
)
def test_a_service_label_goes_to_the_member_holding_the_card(
    members: list[ModelEntry], chosen: str
) -> None:
    resolution = InMemoryDirectory(members).resolve("chat")
    assert resolution.entry is not None and resolution.entry.name == chosen
    assert resolution.by_service_label


def test_a_model_name_shadows_a_service_label_and_labels_obey_namespaces() -> None:
    named_chat = model("chat", "a")
    labelled = model("other", "a", labels=("chat",))
    assert InMemoryDirectory([named_chat, labelled]).resolve("chat").entry == named_chat
    split = InMemoryDirectory(
        [model("m1", "a", labels=("code",)), model("m2", "b", labels=("code",))]
    )
    assert split.resolve("code").ambiguous == ("a", "b")
    chosen = split.resolve("b/code").entry
    assert chosen is not None and chosen.name == "m2"


def test_a_name_in_one_namespace_and_a_label_in_another_is_ambiguous() -> None:
    """Tenant capture (issue 20): team-evil's Model `chat` must not take the requests
    meant for team-b's members labelled `chat`, whichever namespace came first."""
    team_b = model("small", "team-b", ready=True, labels=("chat",), active=("chat",))
    evil = model("chat", "team-evil", ready=True)
    resolution = InMemoryDirectory([team_b, evil]).resolve("chat")
    assert resolution.entry is None
    assert resolution.ambiguous == ("team-b", "team-evil")
    assert resolution.labelled_in == ("team-b",)
    # An order the administrator gave decides, whichever way round the two are.
    for order in (["team-b", "team-evil"], ["team-evil", "team-b"]):
        chosen = InMemoryDirectory([team_b, evil], namespaces=order).resolve("chat").entry
        assert chosen is not None and chosen.namespace == order[0]


def test_a_client_resolves_among_the_namespaces_its_key_reaches() -> None:
    team_b = model("small", "team-b", labels=("chat",))
    evil = model("chat", "team-evil")
    directory = InMemoryDirectory([team_b, evil, model("x", "a"), model("x", "b")])
    only_b = frozenset({"team-b"})
    chosen = directory.resolve("chat", reachable=only_b).entry
    assert chosen is not None and chosen.key == "team-b/small"
    assert directory.resolve("team-evil/chat", reachable=only_b).entry is None
    assert directory.resolve("x", reachable=frozenset({"b"})).entry == model("x", "b")
    assert directory.resolve("x", reachable=frozenset()).entry is None


def test_a_resolution_made_before_a_change_is_not_served_after_it() -> None:
    """Resolutions are kept between requests until the view changes."""
    parked = model("m", "a")
    directory = InMemoryDirectory([parked])
    first = directory.resolve("m").entry
    assert first is not None and not first.ready
    directory.set_ready("m")
    now = directory.resolve("m").entry
    assert now is not None and now.ready, "the cached resolution was dropped"
    directory.put(model("m", "b"))
    assert directory.resolve("m").ambiguous == ("a", "b")
    directory.remove("b/m")
    assert directory.resolve("m").entry == attrs.evolve(parked, ready=True, phase="Ready")
