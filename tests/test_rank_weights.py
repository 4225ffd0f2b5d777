"""The reranker's weights as the service applies them (solos_rank), and the listwise fit that makes them
(bench/ltr_fit.fit_listwise): no server, no data set."""

import sys
from pathlib import Path

import pytest

import solos_rank

QUESTION = "What did Melanie paint last week?"
WRITERS = ["Melanie", "Caroline"]


def view(text: str, agent: str = "Melanie") -> dict:
    return solos_rank.ranking_view(text, agent, "1:56 pm on 8 May, 2023", None)


def first_pass(fused: float, rank: int, keyword: float, prev: float = 0.0, nxt: float = 0.0) -> dict:
    return {
        "fused": fused,
        "fused_rank": rank,
        "keyword": keyword,
        "keyword_rank": rank,
        "neighbour_prev": prev,
        "neighbour_next": nxt,
    }


def logits(weights: tuple, vector: bool) -> dict[str, float]:
    """The logit of three candidates: a row that asks what the question asks, the row answering it, a stray."""
    question = solos_rank.Question.of(QUESTION, solos_rank.query_words(QUESTION), WRITERS)
    asks = view("What did you paint last week, Melanie?", "Caroline")
    answer = view("I painted a sunset over the lake last week.")
    stray = view("We went camping with the kids in the mountains.", "Caroline")
    extra = (lambda cosine, vec: {"cosine": cosine, "vector": vec}) if vector else (lambda cosine, vec: {})
    rows = {
        "asks": solos_rank.ltr_features(
            question, asks, None, answer, {**first_pass(1.0, 1, 1.0, 0, 0.2), **extra(0.6, 1.0)}
        ),
        "answer": solos_rank.ltr_features(
            question, answer, asks, None, {**first_pass(0.8, 2, 0.8, 1.0, 0), **extra(0.55, 0.9)}
        ),
        "stray": solos_rank.ltr_features(question, stray, None, None, {**first_pass(0.2, 3, 0.2), **extra(0.1, 0.1)}),
    }
    return {name: solos_rank.ltr_score(features, weights) for name, features in rows.items()}


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_every_feature_ltr_features_gives_meets_one_weight(mode):
    """ltr_score pairs weights and features by position: one more or one fewer would shift or drop some."""
    weights = solos_rank.LTR_KEYWORD_WEIGHTS if mode == "keyword" else solos_rank.LTR_HYBRID_WEIGHTS
    question = solos_rank.Question.of(QUESTION, solos_rank.query_words(QUESTION), WRITERS)
    vector = {"cosine": 0.6, "vector": 1.0} if mode == "hybrid" else {}
    features = solos_rank.ltr_features(
        question, view("I painted a sunset last week."), None, None, {**first_pass(0.8, 2, 0.8), **vector}
    )
    assert len(features) == len(weights) - 1  # the bias first
    assert tuple(features) == solos_rank.feature_names(mode == "hybrid")
    by_name = {name: pair[0 if mode == "keyword" else 1] for name, pair in solos_rank.LTR_WEIGHTS.items()}
    expected = by_name["bias"] + sum(by_name[name] * value for name, value in features.items())
    assert solos_rank.ltr_score(features, weights) == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_a_feature_missing_or_extra_is_an_error_not_a_truncation(mode):
    weights = solos_rank.LTR_KEYWORD_WEIGHTS if mode == "keyword" else solos_rank.LTR_HYBRID_WEIGHTS
    question = solos_rank.Question.of(QUESTION, solos_rank.query_words(QUESTION), WRITERS)
    vector = {"cosine": 0.6, "vector": 1.0} if mode == "hybrid" else {}
    features = solos_rank.ltr_features(question, view("A sunset."), None, None, {**first_pass(0.8, 2, 0.8), **vector})
    for broken in ({k: v for k, v in features.items() if k != "coverage"}, {**features, "extra": 1.0}):
        with pytest.raises(ValueError):
            solos_rank.ltr_score(broken, weights)


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_the_row_after_a_matching_question_outranks_the_question_and_a_stray_row(mode):
    weights = solos_rank.LTR_KEYWORD_WEIGHTS if mode == "keyword" else solos_rank.LTR_HYBRID_WEIGHTS
    got = logits(weights, mode == "hybrid")
    assert got["answer"] > got["asks"] > got["stray"]
    assert all(0.0 < solos_rank.logistic(logit) < 1.0 for logit in got.values())


def test_the_listwise_fit_ranks_by_the_telling_feature_and_calibrates_its_score():
    np = pytest.importorskip("numpy")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import ltr_fit

    rng = np.random.default_rng(7)
    data = []
    for _ in range(3):  # three "conversations" of 40 questions x 10 candidates, one answer each
        X, y, qs, cs = [], [], [], []
        for q in range(40):
            telling = rng.normal(size=10)
            answer = int(np.argmax(telling + rng.normal(scale=0.5, size=10)))
            X += [[t, rng.normal()] for t in telling]  # the second feature is noise
            y += [float(i == answer) for i in range(10)]
            qs += [q] * 10
            cs += list(range(10))
        data.append((np.array(X), np.array(y), np.array(qs), np.array(cs)))
    w, mu, sd = ltr_fit.fit_listwise(data, 1.0)
    assert w[0] > 5 * abs(w[1])  # standardised weights: the telling feature, not the noise
    X = np.vstack([d[0] for d in data])
    y = np.concatenate([d[1] for d in data])
    p = 1 / (1 + np.exp(-(np.hstack([(X - mu) / sd, np.ones((len(X), 1))]) @ w)))
    assert p.mean() == pytest.approx(y.mean(), abs=1e-6)  # calibrated: a logistic fit with a bias keeps the mean
    top = [int(np.argmax(p[i : i + 10])) for i in range(0, len(p), 10)]
    assert np.mean([y[i + t] for i, t in zip(range(0, len(p), 10), top)]) > 0.6


def test_a_row_with_no_topic_thread_is_alone_and_gets_its_own_copies():
    """Hybrid: a fact store's row (no previous, no next in its topic) reads `alone` and the *_alone copies of its
    leg scores; a chat turn with a neighbour reads 0 in all of them (chat features must not cost
    facts). Keyword-only has none of them."""
    question = solos_rank.Question.of(QUESTION, solos_rank.query_words(QUESTION), WRITERS)
    row, other = view("I painted a sunset last week."), view("Nice!", "Caroline")
    extra = {"cosine": 0.6, "vector": 1.0}
    alone = solos_rank.ltr_features(question, row, None, None, {**first_pass(0.8, 2, 0.8), **extra})
    threaded = solos_rank.ltr_features(question, row, other, None, {**first_pass(0.8, 2, 0.8), **extra})
    assert alone["alone"] == 1.0 and threaded["alone"] == 0.0
    for name in solos_rank.ALONE_FEATURES:
        assert alone[f"{name}_alone"] == alone[name] and threaded[f"{name}_alone"] == 0.0
    keyword = solos_rank.ltr_features(question, row, None, None, first_pass(0.8, 2, 0.8))
    assert not any(name.endswith("alone") for name in keyword)


@pytest.mark.slow
def test_the_shipped_weights_are_the_fit_scripts_output():
    """LTR_WEIGHTS is what bench/ltr_fit.py fits (LoCoMo's dev split; hybrid also the fleet's fit half) (about 20 s)."""
    pytest.importorskip("numpy")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import ltr_fit
    from locomo_data import DEFAULT_DATA

    import solos_embed

    if not Path(DEFAULT_DATA).exists():
        pytest.skip(f"{DEFAULT_DATA} is missing")
    try:
        embedder = solos_embed.load_embedder(None)
    except solos_embed.EmbeddingsUnavailable as error:
        pytest.skip(f"no embedder: {error}")
    convs = ltr_fit.load_conversations(DEFAULT_DATA)
    kw = ltr_fit.recipe_keyword(convs)
    fitted = ltr_fit.service_weights(convs, kw, ltr_fit.recipe_vector(convs, embedder))
    assert fitted["keyword"] == pytest.approx(solos_rank.LTR_KEYWORD_WEIGHTS, abs=2e-4)
    assert fitted["hybrid"] == pytest.approx(solos_rank.LTR_HYBRID_WEIGHTS, abs=2e-4)
