"""Constituency parses for raw text: the one door to Stanza, and the parse stage."""
