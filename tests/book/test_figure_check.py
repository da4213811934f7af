"""The figure check the book build runs in each chapter's kernel (course_tools.book.figures)."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_tools.book.figures import axis_label_problems  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_a_plot_with_both_labels_passes_and_each_missing_label_is_named():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    assert axis_label_problems(fig) == ["axes 0 has no x or y label"]
    ax.set_xlabel("step")
    assert axis_label_problems(fig) == ["axes 0 has no y label"]
    ax.set_ylabel("loss")
    ax.set_title("training")
    assert axis_label_problems(fig) == []


def test_pictures_with_the_axes_off_and_empty_axes_are_not_checked():
    fig, (a, b) = plt.subplots(1, 2)
    a.plot([0, 1], [0, 1])
    a.axis("off")
    assert axis_label_problems(fig) == []


def test_a_grid_may_label_its_outer_row_and_column_or_the_whole_figure():
    fig, axes = plt.subplots(2, 2)
    for ax in axes.flat:
        ax.imshow([[0, 1], [1, 0]])
    assert len(axis_label_problems(fig)) == 4
    for ax in axes[1]:
        ax.set_xlabel("key position")
    axes[0, 0].set_ylabel("query position")
    assert axis_label_problems(fig) == ["axes 2 has no y label", "axes 3 has no y label"]
    axes[1, 0].set_ylabel("query position")
    assert axis_label_problems(fig) == []


def test_shared_axes_and_figure_labels_count():
    fig, (a, b) = plt.subplots(1, 2, sharey=True)
    a.plot([1, 2], [1, 2], label="x")
    b.bar([1, 2], [1, 2])
    fig.colorbar(a.scatter([1], [1], c=[1]), ax=b)
    fig.supxlabel("tokens")
    assert axis_label_problems(fig) == ["axes 0 has no y label", "axes 1 has no y label"]
    a.set_ylabel("loss")
    assert axis_label_problems(fig) == []


def test_named_categories_label_their_axis():
    fig, ax = plt.subplots()
    ax.barh(["matmul", "elementwise"], [10.0, 0.5])
    assert axis_label_problems(fig) == ["axes 0 has no x label"]
    ax.set_xlabel("GFLOP/s")
    assert axis_label_problems(fig) == []


def test_the_report_is_read_back_from_any_split_of_the_output():
    import nbformat

    from course_tools.book import figures

    found = [{"source": "plt.plot([1])", "problem": "axes 0 has no x or y label"}]
    line = figures.MARKER + json.dumps(found) + "\n"
    cell = nbformat.v4.new_code_cell(outputs=[
        nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
        nbformat.v4.new_output("stream", name="stdout", text=line[:7]),
        nbformat.v4.new_output("stream", name="stdout", text=line[7:]),
    ])
    assert figures.read_report(cell) == found
