"""``:name`` placeholders compiled into asyncpg's ``$n`` (``app.repository.named_statements``):
what is a placeholder and what is not, and how keyword arguments bind."""

from __future__ import annotations

import pytest

from app.repository.named_statements import NamedStatement, compile_named


def test_placeholders_are_numbered_in_order_of_first_use():
    statement = compile_named("SELECT :b, :a, :c")
    assert statement == NamedStatement("SELECT $1, $2, $3", ("b", "a", "c"))


def test_a_name_used_twice_maps_to_the_same_number():
    statement = compile_named("WHERE id = :id AND attempt = :attempt OR parent = :id")
    assert statement.sql == "WHERE id = $1 AND attempt = $2 OR parent = $1"
    assert statement.names == ("id", "attempt")


def test_a_statement_without_placeholders_keeps_its_text():
    assert compile_named("SELECT 1") == NamedStatement("SELECT 1", ())


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT x::vector", "SELECT x::vector"),
        ("SELECT :v::vector", "SELECT $1::vector"),
        (
            "SELECT :at::timestamptz, now()::timestamptz",
            "SELECT $1::timestamptz, now()::timestamptz",
        ),
        ("SELECT CAST(:v AS vector(3))", "SELECT CAST($1 AS vector(3))"),
        ("SELECT :ids::int[]", "SELECT $1::int[]"),
        ("SELECT make_interval(secs => :s)", "SELECT make_interval(secs => $1)"),
        ("SELECT (:a)", "SELECT ($1)"),
        ("SELECT ARRAY[:a,:b]", "SELECT ARRAY[$1,$2]"),
        ("WHERE x=:a", "WHERE x=$1"),
        ("SELECT :a_1, :_b", "SELECT $1, $2"),
    ],
)
def test_placeholders_next_to_casts_and_punctuation(sql, expected):
    assert compile_named(sql).sql == expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 'a :name b'",
        "SELECT 'it''s :name'",
        "SELECT E'\\' :name'",
        "SELECT e'a\\\\', ':name'",
        'SELECT "odd :name column"',
        'SELECT "a "":name"""',
        "SELECT 1 -- :name in a comment",
        "SELECT 1 /* :name */",
        "SELECT 1 /* outer /* :inner */ :still_comment */",
        "SELECT $$ :name $$",
        "SELECT $body$ :name $$ :name $body$",
        "SELECT a[lo:hi], a[1:2]",
        "DO $$ BEGIN x := 1; END $$",
        "SELECT 1 AS a$b, x:= 1",
    ],
)
def test_no_placeholder_inside_literals_identifiers_comments_or_slices(sql):
    assert compile_named(sql) == NamedStatement(sql, ())


def test_placeholders_around_literals_and_comments_are_still_found():
    sql = "SELECT :a, 'x:y' -- :not\n  , /* :not */ :b, \"c:d\", $q$:not$q$, E'\\':not', :c::text"
    statement = compile_named(sql)
    assert statement.names == ("a", "b", "c")
    assert statement.sql == (
        "SELECT $1, 'x:y' -- :not\n  , /* :not */ $2, \"c:d\", $q$:not$q$, E'\\':not', $3::text"
    )


def test_a_word_ending_in_e_before_a_quote_is_not_an_escape_string():
    # "type'..." is not E'...': the backslash is an ordinary character and ends nothing.
    assert compile_named("SELECT type'a\\', :b").names == ("b",)


@pytest.mark.parametrize("sql", ["SELECT $1", "SELECT :a, $2", "WHERE x = ($1)"])
def test_positional_parameters_are_refused(sql):
    with pytest.raises(ValueError, match="positional parameter"):
        compile_named(sql)


@pytest.mark.parametrize(
    ("sql", "opening"),
    [
        ("SELECT 'open :a", "' quote"),
        ('SELECT "open', '" quote'),
        ("SELECT 1 /* open /* */", "block comment"),
        ("SELECT $x$ open $y$", "dollar quote"),
    ],
)
def test_an_unterminated_literal_is_refused(sql, opening):
    with pytest.raises(ValueError, match=f"unterminated {opening}"):
        compile_named(sql)


STATEMENT = compile_named("SELECT :context_id, :attempt, :embedding::vector, :attempt")


def test_bind_orders_keyword_arguments_as_the_numbers():
    args = STATEMENT.bind({"embedding": [1.0], "context_id": 7, "attempt": 2})
    assert args == [7, 2, [1.0]]


def test_bind_refuses_a_missing_keyword_naming_it_and_not_the_values():
    with pytest.raises(TypeError, match=r"missing attempt, embedding$") as raised:
        STATEMENT.bind({"context_id": "value-marker"})
    assert "value-marker" not in str(raised.value)


def test_bind_refuses_an_unexpected_keyword():
    with pytest.raises(TypeError, match=r"unexpected attemp, extra$"):
        STATEMENT.bind({"context_id": 1, "attempt": 2, "embedding": 3, "extra": 4, "attemp": 5})


def test_bind_names_a_misspelled_keyword_both_ways():
    with pytest.raises(TypeError, match=r"missing attempt; unexpected attemp$"):
        STATEMENT.bind({"context_id": 1, "attemp": 2, "embedding": 3})


def test_a_statement_without_placeholders_binds_nothing():
    assert compile_named("SELECT 1").bind({}) == []
    with pytest.raises(TypeError, match="unexpected x"):
        compile_named("SELECT 1").bind({"x": 1})


def test_a_single_placeholder_binds_a_one_element_list():
    statement = compile_named("SELECT :value::text")
    assert statement.bind({"value": (1, 2)}) == [(1, 2)]
    with pytest.raises(TypeError, match="missing value; unexpected other"):
        statement.bind({"other": 1})
