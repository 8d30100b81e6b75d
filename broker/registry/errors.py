"""The registry's errors, in Confluent Schema Registry's shape and codes: an HTTP status
and a body `{"error_code": <code>, "message": <why>}`, where the code is the status
followed by two digits telling the cases apart (docs/schemas.md, "Errors")."""

from __future__ import annotations


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def body(self) -> dict:
        return {"error_code": self.code, "message": self.message}


def malformed_request(why: str) -> RegistryError:
    return RegistryError(400, 400, f"Malformed request: {why}")


def unauthenticated(why: str) -> RegistryError:
    return RegistryError(401, 401, why)


def forbidden(principal: str, operation: str, what: str) -> RegistryError:
    return RegistryError(403, 40301, f"{principal} is not allowed {operation} on {what}")


def not_found(path: str) -> RegistryError:
    return RegistryError(404, 404, f"HTTP 404 Not Found: no such endpoint {path}")


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: object) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found for subject '{subject}'.")


def schema_not_found(what: str = "Schema not found") -> RegistryError:
    return RegistryError(404, 40403, what)


def subject_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(404, 40404, f"Subject '{subject}' was soft deleted. Set permanent=true to delete permanently")


def subject_not_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(404, 40405,
                         f"Subject '{subject}' was not deleted first before being permanently deleted")


def version_soft_deleted(subject: str, version: int) -> RegistryError:
    return RegistryError(404, 40406, f"Subject '{subject}' Version {version} was soft deleted. "
                                     "Set permanent=true to delete permanently")


def version_not_soft_deleted(subject: str, version: int) -> RegistryError:
    return RegistryError(404, 40407, f"Subject '{subject}' Version {version} was not deleted first before "
                                     "being permanently deleted")


def subject_config_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")


def incompatible(messages: list[str]) -> RegistryError:
    return RegistryError(409, 409, "Schema being registered is incompatible with an earlier schema for subject; "
                                   + "; ".join(messages))


def too_large(limit: int) -> RegistryError:
    return RegistryError(413, 413, f"Request body too large: at most {limit} bytes")


def invalid_schema(why: str) -> RegistryError:
    return RegistryError(422, 42201, f"Invalid schema: {why}")


def invalid_version(version: str) -> RegistryError:
    return RegistryError(422, 42202, f"The specified version '{version}' is not a valid version id. Allowed "
                                     "values are between [1, 2^31-1] and the string \"latest\"")


def invalid_compatibility(level: object) -> RegistryError:
    return RegistryError(422, 42203, f"Invalid compatibility level {level!r}: one of BACKWARD, BACKWARD_TRANSITIVE, "
                                     "FORWARD, FORWARD_TRANSITIVE, FULL, FULL_TRANSITIVE, NONE")


def invalid_subject(subject: str) -> RegistryError:
    return RegistryError(422, 42208, f"The specified subject {subject[:300]!r} is not valid: 1 to 255 printable "
                                     "characters")


def store_error(why: str) -> RegistryError:
    return RegistryError(500, 50001, f"Error in the backend data store: {why}")
