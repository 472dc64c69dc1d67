"""What a key means in each format: metadata schemas, chunk key grammars, chunk checks."""
