"""Constituency parses for raw text: the `Parser` protocol, Stanza behind its one door, and the parse stage."""
