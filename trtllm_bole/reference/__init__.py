"""Plain-torch truth for every Bole operator (float64 capable): the oracle of all tests."""
