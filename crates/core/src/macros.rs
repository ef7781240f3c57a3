//! Macros the layer crates share.

/// Defines `get_ref`, `get_mut` and `into_inner` for a service that wraps its inner service
/// `S` in a field named `inner`, as tower's services have them. Used inside an
/// `impl<S, ..> Type<S, ..> { .. }` block.
#[doc(hidden)]
#[macro_export]
macro_rules! inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// Consumes the service, returning the inner one.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}
