"""What a read of the UI's views refuses, as the API answers it (404, 400): apart from `queries`, so that
mounting the routes does not import the queries (about 3 MB) before anyone asks for a view."""


class NotFound(LookupError):
    """The series (or other item) asked for does not exist."""


class TooBroad(ValueError):
    """The view would read more than one request may; the message says how to narrow it."""
