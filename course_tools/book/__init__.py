"""The maintainers' build: run the solution notebooks, record what the text quotes, build the
HTML book, release the student notebooks. Runs no student code.
"""
